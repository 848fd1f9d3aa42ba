"""Stage 2: PT2E quantization for TOSA targets (int8 weights and activations, int32 bias)."""

from .config import (QuantizationConfig, get_symmetric_a8w4_quantization_config, get_symmetric_a16w8_quantization_config,
                     get_symmetric_quantization_config)
from .quantizer import CortexMQuantizer, EthosUQuantizer, TOSAQuantizer, VgfQuantizer

__all__ = [
    "QuantizationConfig",
    "get_symmetric_quantization_config",
    "get_symmetric_a16w8_quantization_config",
    "get_symmetric_a8w4_quantization_config",
    "TOSAQuantizer",
    "EthosUQuantizer",
    "VgfQuantizer",
    "CortexMQuantizer",
]
