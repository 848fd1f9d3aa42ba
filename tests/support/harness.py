"""The lowering harness of the op and model tests: compile a module for a target and prove the result."""

from __future__ import annotations

import os

import pytest

from support.npu import NPU_DIFFERENCES, assert_npu_bit_exact, ethosu_delegates


class Harness:
    """Compile a module for a target and prove the result: TOSA on the reference model against
    PyTorch, Vela for Ethos-U, and where every op ended up."""

    FP_TOL = 1e-4
    INT_FRACTION = 0.999

    def compile(self, module, inputs, target, quantize, **kw):
        from tosakit.flow import compile

        return compile(module, inputs, target, quantize=quantize, **kw)

    @staticmethod
    def cpu_compute(compiled) -> list:
        """Ops left on the CPU other than the quantize/dequantize at the delegate boundary."""
        return [p for p in compiled.edge.placements if p.placement == "cpu" and p.compute]

    def assert_delegated(self, compiled):
        left = self.cpu_compute(compiled)
        assert not left, "ops left on the CPU: " + "; ".join(f"{p.node}: {p.reason}" for p in left)
        assert compiled.edge.delegates, "no delegate was created"

    def assert_checks(self, compiled, inputs):
        from tosakit.runtime import check_delegates

        checks = check_delegates(compiled.edge, inputs)
        assert checks, "no delegate output was compared"
        bad = [str(c) for c in checks if not c.passed]
        assert not bad, "; ".join(bad)
        profiles = compiled.spec.tosa_spec.support_integer(), compiled.spec.tosa_spec.support_float()
        if VGF_OPS and profiles[0] != profiles[1]:  # a TOSA INT or FP case: also on the VGF engine
            assert_vgf_engine(compiled.edge, inputs)
        return checks

    def fp(self, module, inputs, target="TOSA-1.0+FP"):
        """Float model, FP profile: delegate matches PyTorch to FP_TOL (relative)."""
        compiled = self.compile(module, inputs, target, quantize=False)
        self.assert_delegated(compiled)
        checks = self.assert_checks(compiled, inputs)
        assert all(not c.integer for c in checks)
        return compiled

    def int(self, module, inputs, target="TOSA-1.0+INT", **kw):
        """Quantized model, INT profile: within one step of the fake-quantized model (convert_pt2e); ``kw`` for
        ``compile`` (a quantization ``config``)."""
        compiled = self.compile(module, inputs, target, quantize=True, **kw)
        self.assert_delegated(compiled)
        self.assert_checks(compiled, inputs)
        self.assert_matches_fake_quant(compiled, inputs)
        return compiled

    def assert_matches_fake_quant(self, compiled, inputs):
        """The whole program on the host vs the convert_pt2e model evaluated exactly (``evaluate_exact``), in
        output steps. (Not its float32 run: where a case rounds more than once, which one-step ties fall
        the other way depends on float summation order, and the next layer can carry one past a step.)"""
        import numpy as np

        from tosakit.quantize.qdq import is_dequantize, qparams_of
        from tosakit.runtime import evaluate_exact, run_edge

        got = run_edge(compiled.edge, *inputs)
        want = evaluate_exact(compiled.quantized, *inputs)
        gm = compiled.edge.program.graph_module
        out_nodes = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        for node, g, w in zip(out_nodes, got, want):
            step = qparams_of(node, gm).s if is_dequantize(node) else 0.0
            off = np.abs(g.numpy().astype(np.float64) - w.numpy().astype(np.float64)) > step * 1.001 + 1e-6
            assert off.mean() <= 1 - self.INT_FRACTION, f"{100 * off.mean():.3f}% of outputs more than one step off"

    def assert_integer_lowering(self, edge, inputs, quantized=None, program_outputs=None) -> int:
        """A quantized program judged in terms no float summation order can move (a random-weight network
        cannot be judged end to end against its fake-quantized model: a one-step rounding tie, decided by the
        summation order of the float calibration or reference, grows layer by layer):

        - each layer inside each delegate is within one step of the exact (float64) fake-quantized layer fed
          the lowering's own integers (``layer_reports``): a wrong op, rescale or constant fails here;
        - the whole program (run on the host, or ``program_outputs``) equals bit for bit the exact
          fake-quantized graph in which each quantize takes the integers the lowering produced there: wrong
          plumbing from the checked layers to the delegates' outputs and on (output order, layout, which
          value a delegate returns) fails here;
        - with ``quantized`` (the convert_pt2e model): where every compute op is delegated, the partitioned
          program with each delegate evaluated exactly as the graph it replaced equals ``evaluate_exact`` of
          that model bit for bit: capture and partitioning (the quantize and dequantize left on the CPU
          too) kept the model's meaning.

        Returns how many layers were checked."""
        import torch

        from tosakit.runtime import evaluate_exact, run_edge
        from tosakit.verify.layers import layer_reports

        layers = layer_reports(edge, inputs, None)
        assert (layers or not edge.delegates) and all(layer.matches for layer in layers), [
            (layer.node, layer.target, layer.steps_off, layer.rel_error) for layer in layers if not layer.matches]
        got = program_outputs if program_outputs is not None else run_edge(edge, *inputs)
        want = forced_exact(edge, inputs)
        assert len(got) == len(want)
        for k, (g, w) in enumerate(zip(got, want)):
            assert g.dtype == w.dtype and torch.equal(g, w), \
                f"output {k}: {float((g.double() - w.double()).abs().max())} off the lowering's own layers"
        if quantized is not None and not self.cpu_compute(type("C", (), {"edge": edge})()):
            exact = forced_exact(edge, inputs, force=False)
            for k, (e, w) in enumerate(zip(exact, evaluate_exact(quantized, *inputs))):
                assert torch.equal(e, w), f"output {k}: the partitioned program is not the quantized model"
        return len(layers)

    def ethosu(self, module, inputs, target, case: str | None = None, **kw):
        """Quantized for an Ethos-U: every op on the NPU (Vela agrees), integers match PyTorch; on U55/U65 the
        command stream, simulated, equals the reference model on its TOSA (or differs as NPU_DIFFERENCES pins
        for ``case``); ``kw`` for ``compile`` (a quantization ``config``)."""
        compiled = self.compile(module, inputs, target, quantize=True, **kw)
        self.assert_delegated(compiled)
        for d in compiled.edge.delegates:
            assert d.backend_id == "EthosUBackend"
            assert d.report.cpu_ops == 0 and d.report.npu_ops > 0, d.report.summary()
        self.assert_checks(compiled, inputs)
        if not target.startswith("ethos-u85"):
            for tosa, payload in ethosu_delegates(compiled):
                if case in NPU_DIFFERENCES:
                    with pytest.raises(AssertionError, match="values differ"):
                        assert_npu_bit_exact(tosa, payload)
                else:
                    assert_npu_bit_exact(tosa, payload)
        return compiled


def forced_exact(edge, inputs, force: bool = True) -> tuple:
    """The program's outputs with each delegate replaced by the graph it lowered, evaluated exactly
    (``ExactInterpreter``), each quantize in it taking the integers the delegate's TOSA produced there (run
    with every op's result an output); CPU ops run in PyTorch as ``run_edge`` runs them. Without ``force``,
    nothing is forced and the CPU ops too are evaluated exactly."""
    import copy

    import torch
    from torch.fx import Interpreter

    from tosakit.lower import lower_partition
    from tosakit.program.emit import executorch_call_delegate
    from tosakit.runtime.delegates import ExactInterpreter
    from tosakit.runtime.stored import run_stored
    from tosakit.verify.layers import _quantize_after

    def delegate(module, tensors):
        forced = {}
        if force:
            graph = copy.deepcopy(module.original_module)
            lowered = lower_partition(graph, module.tosa_spec, probes=True)
            probes = run_stored(lowered.tosa, tensors, [v.order for v in lowered.inputs], [])[len(lowered.outputs):]
            nodes = {n.name: n for n in graph.graph.nodes}
            for (name, _), value in zip(lowered.probes, probes):
                q = _quantize_after(nodes[name], module.original_module)
                if q is not None:
                    forced[q.name] = value
        out = ExactInterpreter(module.original_module, None, forced).run(*tensors)
        out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        return tuple(o.float() if force and o.is_floating_point() else o for o in out)

    def call_function(self, target, args, kwargs):
        if target is executorch_call_delegate:
            return delegate(args[0], list(args[1:]))
        return base.call_function(self, target, args, kwargs)

    base = Interpreter if force else ExactInterpreter
    runner = type("ForcedExact", (base,), {"call_function": call_function})(edge.program.graph_module)
    with torch.no_grad():
        out = runner.run(*inputs)
    out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    return tuple(o.float() if o.is_floating_point() else o for o in out)


# Every INT and FP case of the op and model tests also runs on the VGF engine (about 85 s of a 2-core run);
# TOSAKIT_TEST_VGF_OPS=0 leaves it out of a quick local run.
VGF_OPS = os.environ.get("TOSAKIT_TEST_VGF_OPS", "1") != "0"
_VGF_ENGINE = []  # this test process's VGF engine, started on first use


def assert_vgf_engine(edge, inputs) -> None:
    """Each TOSA delegate converted to VGF by the model converter and run on the VGF engine (Arm's ML SDK) on the
    inputs it is called with: INT bit-exact with its TOSA on the reference model, FP within ExecuTorch's VGF
    tolerance (1e-3). Without the stack: nothing off CI, a failure as root (CI, where `make setup` installs it)."""
    import time

    import numpy as np
    import torch

    from tosakit.backends.vgf import convert
    from tosakit.runtime.delegates import _DelegateInputs, run_delegate
    from tosakit.runtime.vgf import VgfEngine, find_stack, missing

    if missing():
        assert os.geteuid() != 0, f"the VGF engine's stack is missing as root: {missing()}"
        return
    if not _VGF_ENGINE or _VGF_ENGINE[0].proc.poll() is not None:
        _VGF_ENGINE[:] = [VgfEngine(find_stack(), 0.0, threads=1)]  # small graphs, beside the other test worker
    engine = _VGF_ENGINE[0]
    engine.deadline = time.monotonic() + 120
    runner = _DelegateInputs(edge.program.graph_module)
    with torch.no_grad():
        runner.run(*inputs)
    for name, module, args, _ in runner.seen:
        want = run_delegate(module, list(args))
        stored = [x.detach().permute(tuple(o)).contiguous().numpy() for x, o in zip(args, module.input_orders)]
        expected = [w.permute(tuple(o)).numpy() for w, o in zip(want, module.output_orders)]
        got = engine.run(convert(module.tosa), stored, [(e.dtype, e.shape) for e in expected], name)
        for k, (g, e) in enumerate(zip(got, expected)):
            if np.issubdtype(e.dtype, np.floating):
                scale = max(float(np.abs(e).max(initial=0.0)), 1.0)
                assert float(np.abs(g - e).max(initial=0.0)) <= 1e-3 * scale, f"{name} output {k} on the VGF engine"
            else:
                assert np.array_equal(g, e), f"{name} output {k}: the VGF engine differs from the TOSA reference model"
