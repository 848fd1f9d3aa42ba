"""State: buffers a model updates in forward() (a running value, a KV cache), kept by the program from call to
call as ExecuTorch keeps mutable buffers — planned memory with its initial data in a mutable data segment, the
update written back by ``aten::copy_``, as integers when quantized; shared by a program's methods in arena 2."""

from __future__ import annotations

import copy

import pytest
import torch

from tosakit.errors import TosakitError
from tosakit.flow import compile
from tosakit.program.pte import deserialize_pte, serialize_pte
from tosakit.runtime import evaluate_exact, load
from tosakit.runtime.inspect import describe

CALLS = 3


class Running(torch.nn.Module):
    """An output that depends on every earlier call: ``y = linear(x) + state``, then ``state = tanh(y)``."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.register_buffer("state", torch.full((1, 4), 0.25))

    def forward(self, x):
        y = self.linear(x) + self.state
        self.state.copy_(torch.tanh(y))
        return y * 2


def _running():
    torch.manual_seed(0)
    return Running().eval(), torch.randn(1, 4)


def _calls(step, x) -> list[torch.Tensor]:
    return [step(x) for _ in range(CALLS)]


@pytest.mark.parametrize("quantize", [False, True], ids=["fp", "int"])
def test_state_carries_from_call_to_call_in_executorch(program_check, quantize, tmp_path):
    """A CPU program with state (float, and quantized) loads in ExecuTorch's runtime, starts from the buffer's
    value and carries its update to the next call there and in `tosakit run`, as PyTorch does: three calls,
    each output another (a program that dropped the update would repeat the first)."""
    model, x = _running()
    fresh = copy.deepcopy(model)
    compiled = compile(model, (x,), "TOSA-1.0+INT" if quantize else "TOSA-1.0+FP", quantize=quantize,
                       delegate=False)
    path = compiled.program.save(tmp_path / "running.pte")
    et = [torch.from_numpy(outs[0]) for outs in program_check.oracle.run_calls(path, [("forward", (x,))] * CALLS)]
    loaded = load(path)
    host = _calls(lambda v: loaded.run([v])[0], x)
    reference = compiled.quantized if quantize else fresh
    with torch.no_grad():
        want = _calls(lambda v: reference(v), x)
    step = program_check.output_steps(compiled)[0]
    for k, (e, h, w) in enumerate(zip(et, host, want)):
        program_check.assert_matches(h, w, step, f"call {k}: tosakit run vs PyTorch")
        program_check.assert_matches(e, w, step, f"call {k}: ExecuTorch vs PyTorch")
    assert float((want[1] - want[0]).abs().max()) > 10 * (step or 1e-3)  # the state moved the output


@pytest.mark.numerics
@pytest.mark.parametrize("target", ["TOSA-1.0+INT", "ethos-u55-128", "ethos-u85-256"], ids=["int", "u55", "u85"])
def test_quantized_state_stays_integer_in_the_delegate(target):
    """Quantized, the state is int8 in the program: read and written by the delegate with no conversion on the
    CPU, its initial value quantized once; three calls on the host (the Ethos-U command streams simulated) equal
    the fake-quantized model's, evaluated exactly, call by call."""
    model, x = _running()
    compiled = compile(model, (x,), target, quantize=True)
    gm = compiled.edge.program.graph_module
    [state] = [n for n in gm.graph.nodes if n.op == "placeholder" and "state" in n.meta]
    assert state.meta["val"].dtype == torch.int8 and all(u.target.__name__ == "executorch_call_delegate"
                                                         for u in state.users)
    assert set(compiled.program.emitted.kernel_ops) == {"quantized_decomposed::quantize_per_tensor.out",
                                                        "quantized_decomposed::dequantize_per_tensor.out",
                                                        "aten::copy_."}
    loaded = load_bytes(compiled.program.buffer)
    got = _calls(lambda v: loaded.run([v])[0], x)
    want = _calls(lambda v: evaluate_exact(compiled.quantized, v)[0], x)
    assert all(torch.equal(g, w) for g, w in zip(got, want)), [float((g - w).abs().max()) for g, w in zip(got, want)]
    assert not torch.equal(got[0], got[1])


def test_state_in_a_float_delegate_fp():
    """Float, the TOSA-1.0+FP delegate reads the state and returns its update; the program writes it back."""
    model, x = _running()
    reference = copy.deepcopy(model)
    compiled = compile(model, (x,), "TOSA-1.0+FP")
    loaded = load_bytes(compiled.program.buffer)
    with torch.no_grad():
        want = _calls(lambda v: reference(v), x)
    got = _calls(lambda v: loaded.run([v])[0], x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    assert len(compiled.edge.delegates) == 1


def test_inspect_names_the_state():
    model, x = _running()
    compiled = compile(model, (x,), "TOSA-1.0+FP", delegate=False)
    text = describe(load_bytes(compiled.program.buffer))
    assert "state: 1 buffer(s), 16 B, kept from call to call in arena(s) 1; each starts from data in the program" \
        in text


def test_initial_data_past_the_mutable_segment_is_refused():
    """The initial data's offset is checked against the mutable data segment before anything runs."""
    model, x = _running()
    buffer = compile(model, (x,), "TOSA-1.0+FP", delegate=False).program.buffer
    program, segments = deserialize_pte(buffer)
    program.mutable_data_segments[0].offsets[1] = 1 << 20
    bad = serialize_pte(program, segments)
    with pytest.raises(TosakitError, match=r"reads 16 bytes of initial data at offset 1048576, past the 16-byte "
                                           r"mutable data segment 0"):
        load_bytes(bad)


def load_bytes(data: bytes):
    from tosakit.runtime.program import LoadedProgram

    return LoadedProgram(data, "the program")


def test_state_with_a_zero_size_dimension_is_one_clean_outcome():
    """A file whose state tensor has a zero-size dimension (as a mutated decoder's had): no bytes to start from,
    and the run either works or ends in tosakit's error, never in torch's "buffer length (0)" exception."""
    model, x = _running()
    buffer = compile(model, (x,), "TOSA-1.0+FP", delegate=False).program.buffer
    program, segments = deserialize_pte(buffer)
    plan = program.execution_plan[0]
    state = next(v.val for v in plan.values if getattr(v.val, "data_buffer_idx", 0) > 0
                 and v.val.allocation_info is not None)
    state.sizes = [0] + state.sizes[1:]
    loaded = load_bytes(serialize_pte(program, segments))
    try:
        loaded.run([x])
    except TosakitError:
        pass
