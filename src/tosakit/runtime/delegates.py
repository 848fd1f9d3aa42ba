"""Delegates run in this process from their TOSA on the reference model — alone (``run_delegate``) or inside
their edge program (``run_edge``) — and each checked against the graph it replaced (``check_delegates``, against
``evaluate_exact``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.fx import Interpreter

from ..capture import with_state
from ..program import EdgeProgramManager, LoweredBackendModule
from ..program.emit import executorch_call_delegate
from ..quantize.qdq import is_dequantize, is_quantize, qparams_of
from .stored import run_stored


def run_delegate(module: LoweredBackendModule, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """A delegate's TOSA on the reference model, torch-layout tensors in and out."""
    return run_stored(module.tosa, tensors, module.input_orders, module.output_orders)


@dataclass
class DelegateCheck:
    """How one delegate's TOSA output compares with PyTorch on the same inputs."""

    delegate: str
    output: int
    integer: bool
    max_abs_error: float
    max_rel_error: float
    off_by_more_than_one: float  # fraction of integer elements more than one step away
    passed: bool

    def __str__(self) -> str:
        if self.integer:
            detail = f"max |diff| {self.max_abs_error:.0f} step(s), {100 * self.off_by_more_than_one:.3f}% > 1 step"
        else:
            detail = f"max rel error {self.max_rel_error:.2e}"
        return f"{self.delegate} output {self.output}: {detail} -> {'ok' if self.passed else 'MISMATCH'}"


def compare(delegate: str, index: int, got: np.ndarray, want: torch.Tensor, fp_tol: float = 1e-4,
            int_fraction: float = 0.999) -> DelegateCheck:
    """FP: relative error within ``fp_tol``; INT: within one step on ``int_fraction`` of elements."""
    want_np = want.detach().numpy()
    if got.shape != want_np.shape:
        got = got.reshape(want_np.shape) if got.size == want_np.size else got
    if not want.dtype.is_floating_point:
        diff = np.abs(got.astype(np.int64) - want_np.astype(np.int64))
        off = float((diff > 1).mean()) if diff.size else 0.0
        return DelegateCheck(delegate, index, True, float(diff.max(initial=0)), 0.0, off, off <= 1 - int_fraction)
    diff = np.abs(got.astype(np.float64) - want_np.astype(np.float64))
    scale = max(float(np.abs(want_np).max(initial=0.0)), 1e-12)
    rel = float(diff.max(initial=0.0)) / scale
    return DelegateCheck(delegate, index, False, float(diff.max(initial=0.0)), rel, 0.0, rel <= fp_tol)


class ExactInterpreter(Interpreter):
    """Evaluates a quantize/dequantize graph in float64, so only the quantization itself rounds
    (model inputs are quantized from float32, as the program's CPU kernel does). State the graph writes back
    (``copy_`` to a buffer) is stored in the module's buffer, as a PyTorch run stores it.

    A float32 run of a fake-quantized network rounds a few values differently at every
    quantize, and deep networks amplify those flips; integer kernels are exact, so this is
    the evaluation they must match.
    """

    def __init__(self, gm, record: dict | None = None, forced: dict | None = None):
        super().__init__(gm)
        self.record = record  # when given: every node's value, by name
        self.forced = forced or {}  # node name -> value used downstream instead of the computed one

    def run_node(self, n):
        self._node = n
        out = super().run_node(n)
        if self.record is not None:
            self.record[n.name] = out
        return self.forced.get(n.name, out)

    def call_function(self, target, args, kwargs):
        n = self._node
        if is_quantize(n):
            x = args[0] if n.args[0].op == "placeholder" else args[0].double()  # inputs: as the program does
            return qparams_of(n, self.module).quantize(x)
        if is_dequantize(n):
            return qparams_of(n, self.module).dequantize(args[0], torch.float64)
        if target == torch.ops.aten._assert_tensor_metadata.default:
            return None  # it asserts float32 of what runs here in float64
        if target == torch.ops.aten.copy_.default and n.args[0].op == "get_attr":  # state: the module keeps it
            return self.fetch_attr(n.args[0].target).copy_(args[1])
        args = tuple(a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
        return super().call_function(target, args, kwargs)


def evaluate_exact(gm, *args) -> tuple:
    """Outputs of ``gm`` evaluated exactly (see ``ExactInterpreter``), float results as float32."""
    with torch.no_grad():
        out = ExactInterpreter(gm).run(*args)
    out = out if isinstance(out, (tuple, list)) else (out,)
    return tuple(o.float() if o.is_floating_point() else o for o in out)


class _DelegateInputs(Interpreter):
    """Runs the edge graph in PyTorch, keeping each delegate's inputs and reference outputs."""

    def __init__(self, gm):
        super().__init__(gm)
        self.seen: list[tuple[str, LoweredBackendModule, tuple, tuple]] = []

    def call_function(self, target, args, kwargs):
        out = super().call_function(target, args, kwargs)
        if target is executorch_call_delegate:
            name = next(n for n, m in self.module.named_children() if m is args[0])
            self.seen.append((name, args[0], tuple(args[1:]), out))
        return out


class _HostInterpreter(Interpreter):
    """Runs the edge graph with every delegate executed from its TOSA on the reference model."""

    def call_function(self, target, args, kwargs):
        if target is executorch_call_delegate:
            return tuple(run_delegate(args[0], list(args[1:])))
        return super().call_function(target, args, kwargs)


def run_edge(edge: EdgeProgramManager, *inputs) -> tuple:
    """The program's outputs on the host: CPU ops in PyTorch, delegates on the TOSA reference model."""
    with torch.no_grad():
        out = _HostInterpreter(edge.program.graph_module).run(*with_state(edge.program.graph, inputs))
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def check_delegates(edge: EdgeProgramManager, inputs: tuple) -> list[DelegateCheck]:
    """Run every delegate's TOSA on the reference model against PyTorch's result for it."""
    runner = _DelegateInputs(edge.program.graph_module)
    with torch.no_grad():
        runner.run(*with_state(edge.program.graph, inputs))
    checks = []
    for name, module, args, _ in runner.seen:
        want = evaluate_exact(module.original_module, *args)
        got = run_delegate(module, list(args))
        checks += [compare(name, i, g.numpy(), w) for i, (g, w) in enumerate(zip(got, want))]
    return checks
