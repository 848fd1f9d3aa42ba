"""Shared pytest fixtures."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


def _share_the_cores() -> None:
    """Under pytest-xdist each worker computes with its share of the cores, and so do the processes its tests
    start (the CLI, the ExecuTorch oracle): two workers each running two OpenMP threads on two cores make every
    parallel region wait for a descheduled thread (a float64 3x3 convolution on an 8x8 map took 10 ms, not
    0.1 ms). A thread count given in the environment (make test-any-machine's OMP_NUM_THREADS=1, 2, 4) is left as
    it is: the numerics tests hold under any."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers < 2 or "OMP_NUM_THREADS" in os.environ:
        return
    import threadpoolctl
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = max(1, cores // workers)
    os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    threadpoolctl.threadpool_limits(threads)


_share_the_cores()


# ------------------------------------------------------------------ ExecuTorch oracle (et_oracle)


class OracleFailure(AssertionError):
    """The ExecuTorch runtime refused a program; the message carries its log."""


class EtOracle:
    """Runs tests/oracle/et_oracle.py in the oracle venv (ExecuTorch 1.5.1) and parses its answer."""

    Failure = OracleFailure
    SCRIPT = REPO / "tests" / "oracle" / "et_oracle.py"
    MARKER = "ET_ORACLE_RESULT "
    TIMEOUT = 900  # seconds for one request

    def __init__(self, python: Path):
        self.python = python
        self._server: subprocess.Popen | None = None
        self._exporter: EtOracle | None = None  # a second process for export_ethosu

    def _serve(self) -> subprocess.Popen:
        """The oracle process of this test worker, started on first use (and again after a crash)."""
        if self._server is None or self._server.poll() is not None:
            self._server = subprocess.Popen([str(self.python), str(self.SCRIPT), "serve"], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        return self._server

    def _call(self, command: str, **request) -> dict:
        server = self._serve()
        request = {k: str(v) if isinstance(v, os.PathLike) else v for k, v in request.items()}
        server.stdin.write(json.dumps({"command": command, **request}) + "\n")
        server.stdin.flush()
        watchdog = threading.Timer(self.TIMEOUT, server.kill)  # a hung runtime fails the test, not the suite
        watchdog.start()
        try:
            result = self._answer(server)
        finally:
            watchdog.cancel()
        if "error" in result:
            raise OracleFailure("\n".join([result["error"], *result.get("log", [])]))
        return result

    def _answer(self, server: subprocess.Popen) -> dict:
        for line in server.stdout:  # imports print unrelated noise before the first answer
            if line.startswith(self.MARKER):
                return json.loads(line[len(self.MARKER):])
        return {"error": f"the ExecuTorch runtime died (exit status {server.wait()})"}

    def close(self) -> None:
        if self._server is not None and self._server.poll() is None:
            self._server.stdin.close()
            self._server.wait(timeout=60)
        if self._exporter is not None:
            self._exporter.close()

    def load(self, pte: str | os.PathLike, method: str | None = None) -> list[str]:
        """load_program with InternalConsistency verification (and load_method); the method names."""
        return self._call("load", pte=pte, method=method or "")["methods"]

    def run(self, pte: str | os.PathLike, inputs) -> list[np.ndarray]:
        """Execute ``forward`` on ``inputs`` (numpy arrays or torch tensors, channels-last ones passed so);
        the outputs."""
        import torch

        pte = Path(pte)
        ins, outs = pte.with_suffix(".inputs.npz"), pte.with_suffix(".outputs.npz")
        np.savez(ins, **{f"arg{i}": np.asarray(x) for i, x in enumerate(inputs)})
        channels_last = [i for i, x in enumerate(inputs) if getattr(x, "dim", lambda: 0)() == 4
                         and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)]
        count = self._call("run", pte=pte, inputs=ins, outputs=outs, channels_last=channels_last)["outputs"]
        with np.load(outs) as saved:
            return [saved[f"out{i}"] for i in range(count)]

    def run_calls(self, pte: str | os.PathLike, calls: list[tuple[str, tuple]]) -> list[list[np.ndarray]]:
        """Load ``pte`` once and execute its methods in turn, ``calls`` being (method, inputs): each call's
        outputs (the program's state carries from call to call, and between methods)."""
        pte = Path(pte)
        ins, outs = pte.with_suffix(".inputs.npz"), pte.with_suffix(".outputs.npz")
        np.savez(ins, **{f"c{k}_arg{i}": np.asarray(x) for k, (_, inputs) in enumerate(calls)
                         for i, x in enumerate(inputs)})
        self._call("run_calls", pte=pte, inputs=ins, outputs=outs, calls=[m for m, _ in calls])
        with np.load(outs) as saved:
            return [[saved[name] for name in sorted((n for n in saved.files if n.startswith(f"c{k}_out")),
                                                     key=lambda n: int(n.rsplit("out", 1)[1]))]
                    for k in range(len(calls))]

    def kernels(self) -> set[str]:
        """'aten::add.out', ...: every operator the runtime registers a kernel for."""
        return set(self._call("kernels")["kernels"])

    def kernel_schemas(self) -> dict[str, str]:
        """Each registered kernel's schema, as torch prints it beside ExecuTorch 1.5.1."""
        return self._call("kernels")["schemas"]

    def export_program(self, exported, out_pte: str | os.PathLike) -> Path:
        """A .pte made by ExecuTorch itself (``to_edge``, no partitioner) from a torch ExportedProgram."""
        import torch

        out_pte = Path(out_pte)
        saved = out_pte.with_suffix(".pt2")
        torch.export.save(exported, saved)
        self._call("export", model_py=saved, out_pte=out_pte)
        return out_pte

    def export_ethosu(self, module, inputs, folder: str | os.PathLike, name: str = "model",
                      target: str = "ethos-u55-128", memory_mode: str | None = None, quantized: bool = False) -> dict:
        """An Ethos-U program made by ExecuTorch's own Arm backend (its tutorial flow: EthosUQuantizer, calibrate
        on ``inputs``, EthosUPartitioner, to_executorch; tests/oracle/et_export.py) from ``module`` and each
        delegate's TOSA, written into ``folder``; et_export.py's result: {"pte", "quantized" (the quantized graph
        it lowered, .pt2), "delegates": [{"backend", "tosa", "payload_sha256"}] in call order, "cpu_ops",
        "vela_flags", "seconds"}. With ``quantized``, ``module`` is a quantized graph ExecuTorch only lowers.
        Runs in a process of its own, so the runtime oracle never has the Arm backend imported."""
        import torch

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        inputs = tuple(inputs)
        model, saved_inputs = folder / f"{name}.pt2", folder / f"{name}.inputs.pt"
        torch.export.save(torch.export.export(module, inputs), model)
        torch.save(inputs, saved_inputs)
        if self._exporter is None:
            self._exporter = EtOracle(self.python)
        return self._exporter._call("export_ethosu", name=name, model=model, inputs=saved_inputs, target=target,
                                    memory_mode=memory_mode, out=folder, quantized=quantized)

    def export(self, model_source: str, out_pte: str | os.PathLike) -> Path:
        """A .pte made by ExecuTorch itself; ``model_source`` defines ``model`` and ``example_inputs``."""
        out_pte = Path(out_pte)
        source = out_pte.with_suffix(".model.py")
        source.write_text(model_source)
        self._call("export", model_py=source, out_pte=out_pte)
        return out_pte


@pytest.fixture(scope="session")
def et_oracle() -> EtOracle:
    python = Path(os.environ.get("TOSAKIT_ORACLE_PYTHON", REPO / ".venv-oracle" / "bin" / "python"))
    if not python.exists():
        pytest.fail(f"ExecuTorch oracle python {python} not found: run `make oracle` (or `make test`) to create .venv-oracle")
    oracle = EtOracle(python)
    yield oracle
    oracle.close()


# ------------------------------------------------------------------ end of et_oracle


# ------------------------------------------------------------------ lowering harness (op and model tests)


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
        return [p for p in compiled.edge.placements if p.placement == "cpu" and "quantize" not in p.target]

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
    from tosakit.runtime.delegates import ExactInterpreter, run_stored
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


@pytest.fixture(scope="session")
def harness() -> Harness:
    return Harness()


# ------------------------------------------------------------------ the Ethos-U command stream on the host


def npu_inputs(payload, seed: int, tosa: bytes | None = None) -> list[np.ndarray]:
    """Seeded integers over each delegate input's whole range (int32 inputs within +-2**16: the reference
    model calls an int32 sum that leaves int32 unpredictable); an input ``tosa`` reads as GATHER/SCATTER indices
    holds distinct rows in range (SCATTER writes each row once)."""
    from tosakit.runtime.tosa_inprocess import index_bounds

    rng = np.random.default_rng(seed)
    bounds = index_bounds(tosa) if tosa is not None else {}
    out = []
    for k, t in enumerate(payload.inputs):
        if k in bounds:
            size, rows = int(np.prod(t.shape)), bounds[k]
            picks = rng.choice(rows, size, replace=False) if size <= rows else rng.integers(0, rows, size)
            out.append(picks.reshape(t.shape).astype(f"i{t.elem_size}"))
            continue
        info = np.iinfo(f"i{t.elem_size}")
        lo, hi = (-(1 << 16), 1 << 16) if t.elem_size == 4 else (info.min, info.max)
        out.append(rng.integers(lo, hi, size=t.shape, endpoint=True).astype(f"i{t.elem_size}"))
    return out


def assert_npu_bit_exact(tosa: bytes, payload, seeds=(0, 1)) -> None:
    """The simulated command stream's outputs equal the reference model's on the TOSA Vela compiled, bit for
    bit, for seeded inputs over the whole integer range."""
    from tosakit.runtime.ethosu.simulate import simulate
    from tosakit.runtime.tosa_inprocess import run_tosa
    from tosakit.runtime.tosa_validate import check_tosa

    shapes = [t.shape for t in check_tosa(tosa, "delegate", 1 << 31).inputs]
    for seed in seeds:
        xs = npu_inputs(payload, seed, tosa)
        want = run_tosa(tosa, [x.reshape(shape) for x, shape in zip(xs, shapes)])
        got = simulate(payload, xs).outputs
        assert len(got) == len(want)
        for k, (g, w) in enumerate(zip(got, want)):
            g, w = g.reshape(-1).astype(np.int64), np.asarray(w).reshape(-1).astype(np.int64)
            diff = np.flatnonzero(g != w)
            assert g.size == w.size, f"output {k}: {g.size} values simulated, {w.size} from the reference model"
            assert diff.size == 0, (
                f"seed {seed}, output {k}: {diff.size} of {w.size} values differ, first at {diff[0]}: "
                f"simulated {g[diff[0]]}, reference {w[diff[0]]}")


def assert_u85_bit_exact(found, seeds=(0,)) -> str:
    """Each Ethos-U85 delegate in ``found`` run by the simulator (nothing refused) bit for bit; their listings,
    joined."""
    from tosakit.runtime.ethosu.commands import decode, disassemble
    from tosakit.runtime.ethosu.simulate import require_simulated

    listings = []
    for tosa, payload in found:
        stream = require_simulated(decode(payload.cmd_data))
        assert_npu_bit_exact(tosa, payload, seeds=seeds)
        listings += disassemble(stream)
    return "\n".join(listings)


# Op-table cases whose simulated Ethos-U55 stream differs from the TOSA reference model, with why. Each is
# pinned: its test asserts the difference, so a change on either side is seen. (README, "Ethos-U simulator")
NPU_DIFFERENCES = {
    "upsample_nearest_4x2": "Vela 5.2 legalises a (4, 2) nearest upsample as two IFM_UPSCALE NEAREST passes; "
                            "NEAREST doubles height and width alike, so input columns repeat 4x, not 2x",
}


def ethosu_delegates(compiled) -> list[tuple[bytes, object]]:
    """(TOSA, parsed payload) of each Ethos-U delegate of a compiled program."""
    from tosakit.backends.ethosu.payload import parse_payload
    from tosakit.program import LoweredBackendModule

    return [(m.tosa, parse_payload(m.processed_bytes)) for m in compiled.edge.program.graph_module.children()
            if isinstance(m, LoweredBackendModule) and m.backend_id == "EthosUBackend"]


# ------------------------------------------------------------------ programs run three ways


class ProgramCheck:
    """A written .pte executed by the ExecuTorch runtime (the oracle) and by `tosakit run`, both compared
    with PyTorch: float outputs to a relative tolerance, dequantized outputs within one step of the
    fake-quantized model, integer outputs exactly."""

    RTOL = 1e-4  # of the output's largest magnitude: room for another summation order, nothing more

    def __init__(self, oracle: EtOracle, folder: Path):
        self.oracle, self.folder = oracle, folder

    def cpu_only(self, module, inputs, quantize: bool, whole_in_executorch: bool = True):
        """Compile without a partitioner (float or quantized) and check the program everywhere; returns it.
        A quantized program that rounds more than once on the way from an input to an output has its
        ExecuTorch values judged per layer (``layers``): ExecuTorch's float kernels sum in another order than
        PyTorch's, so a one-step tie may fall the other way at one layer and move the next by more than a
        step. Each layer, fed the reference's integers, rounds once: within one step on any machine. (The
        same case's float program, judged whole, proves the wiring between the layers.)"""
        from tosakit.flow import compile

        compiled = compile(module, inputs, "TOSA-1.0+INT" if quantize else "TOSA-1.0+FP", quantize=quantize,
                           delegate=False)
        assert not compiled.edge.delegates
        deep = quantize and whole_in_executorch and roundings(compiled.edge.program.graph_module) > 1
        self.program(compiled, inputs, module, whole_in_executorch and not deep)
        if deep:
            assert self.layers(compiled, inputs) > 0
        return compiled

    def program(self, compiled, inputs, module, whole_in_executorch: bool = True):
        """Save ``compiled``'s program, run it in ExecuTorch and on the host, compare both with PyTorch
        (``module``, or the fake-quantized model when quantized). Without ``whole_in_executorch`` the
        runtime must execute the program and give outputs of the right kind, but its values are judged
        per layer (``layers``)."""
        import torch

        from tosakit.runtime import load

        path = compiled.program.save(self.folder / f"program{len(list(self.folder.glob('*.pte')))}.pte")
        et = [torch.from_numpy(a) for a in self.oracle.run(path, inputs)]
        host = load(path).run(inputs)
        with torch.no_grad():
            want = (compiled.quantized if compiled.quantized is not None else module)(*inputs)
        want = list(want) if isinstance(want, (tuple, list)) else [want]
        steps = self.output_steps(compiled)
        assert len(et) == len(host) == len(want), (len(et), len(host), len(want))
        for k, (e, h, w, step) in enumerate(zip(et, host, want, steps)):
            self.assert_matches(h, w, step, f"output {k}: tosakit run vs PyTorch")
            if whole_in_executorch:
                self.assert_matches(e, w, step, f"output {k}: ExecuTorch vs PyTorch")
                self.assert_matches(h, e, step, f"output {k}: tosakit run vs ExecuTorch")
            else:
                assert e.dtype == h.dtype and e.shape == h.shape and bool(torch.isfinite(e.double()).all()), \
                    f"output {k}: ExecuTorch gave {e.dtype}{list(e.shape)}, tosakit run {h.dtype}{list(h.shape)}"

    def layers(self, compiled, inputs) -> int:
        """Each quantized layer of a CPU-only program, alone: fed the reference's integer inputs, ExecuTorch's
        integers are within one step of the fake-quantized model's. (A whole deep network cannot show
        this: one rounding flip from another float summation order grows layer by layer in random
        weights.) Returns how many layers were checked."""
        import torch
        import torch.utils._pytree as pytree
        from torch.fx import Interpreter

        from tosakit.program.emit import program_from_graph
        from tosakit.program.pte import serialize_pte
        from tosakit.quantize.qdq import is_quantize

        gm = compiled.edge.program.graph_module
        interpreter = Interpreter(gm, garbage_collect_values=False)
        with torch.no_grad():
            interpreter.run(*inputs)
        checked = 0
        for q in [n for n in gm.graph.nodes if is_quantize(n)]:
            layer, frontier = _layer_graph(gm, q)
            if not frontier:  # a quantized constant
                continue
            feed = [interpreter.env[n] if n.op == "placeholder" else interpreter.env[n].contiguous() for n in frontier]
            feed = [x if not isinstance(x, torch.Tensor) or x.is_contiguous()  # ExecuTorch takes no other
                    or x.is_contiguous(memory_format=torch.channels_last) else x.contiguous() for x in feed]
            in_spec = pytree.tree_flatten((tuple(feed), {}))[1]
            out_spec = pytree.tree_flatten((interpreter.env[q],))[1]
            emitted = program_from_graph(layer, in_spec, out_spec)
            path = self.folder / f"layer_{q.name}.pte"
            path.write_bytes(serialize_pte(emitted.program, emitted.segments))
            [got] = self.oracle.run(path, feed)
            want = interpreter.env[q].numpy().astype(np.int32)
            worst = int(np.abs(got.astype(np.int32) - want).max()) if want.size else 0
            assert worst <= 1, f"layer {q.args[0].name} ({q.args[0].target}): {worst} steps off in ExecuTorch"
            checked += 1
        return checked

    @staticmethod
    def output_steps(compiled) -> list[float | None]:
        """Each program output's quantization step (None where it is not dequantized)."""
        from tosakit.quantize.qdq import is_dequantize, qparams_of

        gm = compiled.edge.program.graph_module
        outs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        return [qparams_of(n, gm).s if is_dequantize(n) else None for n in outs]

    def assert_matches(self, got, want, step, what: str):
        import torch

        want = torch.as_tensor(want).detach()
        assert got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape), \
            f"{what}: {got.dtype}{list(got.shape)} vs {want.dtype}{list(want.shape)}"
        if not want.dtype.is_floating_point:
            assert torch.equal(got, want), f"{what}: integer outputs differ"
            return
        g, w = got.double(), want.double()
        limit = step * 1.001 + 1e-6 if step else self.RTOL * max(1.0, float(w.abs().max()))
        worst = float((g - w).abs().max()) if w.numel() else 0.0
        assert worst <= limit, f"{what}: off by {worst:.3g} (allowed {limit:.3g}{', one step' if step else ''})"


def roundings(gm) -> int:
    """The most quantizes (after the inputs' own) on any path from an input to an output of ``gm``."""
    from tosakit.quantize.qdq import is_quantize

    depth = {}
    for n in gm.graph.nodes:
        depth[n] = max((depth[a] for a in n.all_input_nodes), default=0) + int(
            is_quantize(n) and n.args[0].op != "placeholder")
    return max(depth.values(), default=0)


def _layer_graph(gm, q):
    """The ops that compute quantize node ``q`` from the nearest quantized tensors (or program inputs)
    before it, as a graph of its own whose inputs are those tensors."""
    import torch
    import torch.fx

    from tosakit.quantize.qdq import is_quantize

    members, frontier, todo = {q}, [], list(q.all_input_nodes)
    while todo:
        n = todo.pop()
        if n in members or n in frontier:
            continue
        if is_quantize(n) or n.op == "placeholder":
            frontier.append(n)
        else:
            members.add(n)
            todo += n.all_input_nodes
    frontier.sort(key=list(gm.graph.nodes).index)
    graph, env = torch.fx.Graph(), {}
    for n in frontier:  # a quantized tensor fed in is contiguous (its strides in the graph may be a view's)
        env[n] = graph.placeholder(n.name)
        val = n.meta["val"]
        env[n].meta["val"] = val if n.op == "placeholder" else torch.empty(val.shape, dtype=val.dtype)
    for n in gm.graph.nodes:
        if n in members:
            env[n] = graph.node_copy(n, lambda a: env[a])
    graph.output((env[q],))
    return torch.fx.GraphModule(gm, graph), frontier


@pytest.fixture
def program_check(et_oracle, tmp_path) -> ProgramCheck:
    return ProgramCheck(et_oracle, tmp_path)
