"""Tiny random configurations of Hugging Face architectures, ``hf:tiny/NAME``: each architecture's own
transformers classes at a few layers and a small width (they are not hub repositories: tosakit downloads nothing).
Text models take int64 token ids, as a tokenizer gives them; vision models an image, speech models audio."""

from __future__ import annotations

import torch

_IDS = dict(bos_token_id=0, eos_token_id=0, pad_token_id=0)  # special tokens inside the small vocabulary
_TEXT = dict(_IDS, vocab_size=1024, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
             max_position_embeddings=128)
_DECODER = dict(_TEXT, num_key_value_heads=2, tie_word_embeddings=True)


def ids(config: dict, length: int = 32) -> tuple[torch.Tensor]:
    """``length`` int64 token ids below the vocabulary size, seeded."""
    vocab = config.get("vocab_size", 1024)
    return (torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(0)),)


def image(config: dict) -> tuple[torch.Tensor]:
    """One RGB image at the configuration's size."""
    return (torch.randn(1, 3, config["image_size"], config["image_size"]),)


def audio(config: dict) -> tuple[torch.Tensor]:
    """One second of 16 kHz audio."""
    return (torch.randn(1, 16000),)


def mel(config: dict) -> tuple[torch.Tensor]:
    """A log-mel spectrogram as Whisper's encoder takes it: two frames per position."""
    return (torch.randn(1, config["num_mel_bins"], 2 * config["max_source_positions"]),)


# name -> (config class, model class, output field, config, inputs)
TINY = {
    "bert": ("BertConfig", "BertModel", "last_hidden_state", _TEXT, ids),
    "distilbert": ("DistilBertConfig", "DistilBertModel", "last_hidden_state",
                   dict(_IDS, vocab_size=1024, dim=64, n_layers=2, n_heads=4, hidden_dim=128,
                        max_position_embeddings=128),
                   ids),
    "roberta": ("RobertaConfig", "RobertaModel", "last_hidden_state", dict(_TEXT, max_position_embeddings=130), ids),
    "albert": ("AlbertConfig", "AlbertModel", "last_hidden_state", dict(_TEXT, embedding_size=32), ids),
    "mobilebert": ("MobileBertConfig", "MobileBertModel", "last_hidden_state",
                   dict(_TEXT, embedding_size=32, intra_bottleneck_size=32, true_hidden_size=32,
                        num_feedforward_networks=2),
                   ids),
    "electra": ("ElectraConfig", "ElectraModel", "last_hidden_state", dict(_TEXT, embedding_size=32), ids),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", "logits", dict(_IDS, vocab_size=1024, n_embd=64, n_layer=2, n_head=4,
                                                              n_positions=128), ids),
    "llama": ("LlamaConfig", "LlamaForCausalLM", "logits", _DECODER, ids),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", "logits", _DECODER, ids),
    "mistral": ("MistralConfig", "MistralForCausalLM", "logits", dict(_DECODER, sliding_window=None), ids),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", "logits", _DECODER, ids),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", "logits", dict(_DECODER, head_dim=16), ids),
    "vit": ("ViTConfig", "ViTModel", "last_hidden_state", dict(_TEXT, image_size=64, patch_size=8), image),
    "deit": ("DeiTConfig", "DeiTModel", "last_hidden_state", dict(_TEXT, image_size=64, patch_size=8), image),
    "convnext": ("ConvNextConfig", "ConvNextModel", "last_hidden_state",
                 dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 2, 1], image_size=64), image),
    "mobilevit": ("MobileViTConfig", "MobileViTModel", "last_hidden_state",
                  dict(image_size=64, hidden_sizes=[32, 48, 64], neck_hidden_sizes=[8, 16, 24, 32, 48, 64, 160]),
                  image),
    "wav2vec2": ("Wav2Vec2Config", "Wav2Vec2Model", "last_hidden_state",
                 dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                      conv_dim=(32,) * 7, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4), audio),
    "whisper": ("WhisperConfig", "WhisperModel", "encoder", dict(_IDS, decoder_start_token_id=1,
        d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128, decoder_layers=1,
        decoder_attention_heads=4, decoder_ffn_dim=128, num_mel_bins=80, max_source_positions=64, vocab_size=1024),
        mel),
}


class TinyOutput(torch.nn.Module):
    """One output tensor of a transformers model (it returns a ModelOutput); for ``encoder``, the encoder of an
    encoder-decoder model alone."""

    def __init__(self, model: torch.nn.Module, output: str):
        super().__init__()
        self.model = model.get_encoder() if output == "encoder" else model
        self.output = "last_hidden_state" if output == "encoder" else output

    def forward(self, x):
        return getattr(self.model(x), self.output)


def build(transformers, name: str) -> tuple[torch.nn.Module, tuple]:
    """``hf:tiny/NAME``'s module (seeded by the caller) and its example inputs."""
    config_class, model_class, output, config, inputs = TINY[name]
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config))
    return TinyOutput(model, output), inputs(config)
