"""Programs run three ways: a written .pte in the ExecuTorch runtime (the oracle), in `tosakit run`, and PyTorch."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from support.oracle import EtOracle


READ_BACK_BYTES = 1 << 20  # bundles ExecuTorch's serializer reads back (it converts through JSON: seconds per MB)


class ProgramCheck:
    """A written .pte executed by the ExecuTorch runtime (the oracle) and by `tosakit run`, both compared
    with PyTorch: float outputs to a relative tolerance, dequantized outputs within one step of the
    fake-quantized model, integer outputs exactly."""

    RTOL = 1e-4  # of the output's largest magnitude: room for another summation order, nothing more

    def __init__(self, oracle: EtOracle, folder: Path):
        self.oracle, self.folder = oracle, folder

    def cpu_only(self, module, inputs, quantize: bool, whole_in_executorch: bool = True, bundled: bool = False):
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
        self.program(compiled, inputs, module, whole_in_executorch and not deep, bundled)
        if deep:
            assert self.layers(compiled, inputs) > 0
        return compiled

    def program(self, compiled, inputs, module, whole_in_executorch: bool = True, bundled: bool = False):
        """Save ``compiled``'s program, run it in ExecuTorch and on the host, compare both with PyTorch
        (``module``, or the fake-quantized model when quantized). Without ``whole_in_executorch`` the
        runtime must execute the program and give outputs of the right kind, but its values are judged
        per layer (``layers``). ``bundled``: ExecuTorch runs it from a .bpte instead (``bundled_run``)."""
        import torch

        from tosakit.runtime import load

        path = compiled.program.save(self.folder / f"program{len(list(self.folder.glob('*.pte')))}.pte")
        host = load(path).run(inputs)
        steps = self.output_steps(compiled)
        et = self.bundled_run(compiled, inputs, host, steps, whole_in_executorch) if bundled else \
            [torch.from_numpy(a) for a in self.oracle.run(path, inputs)]
        with torch.no_grad():
            want = (compiled.quantized if compiled.quantized is not None else module)(*inputs)
        want = list(want) if isinstance(want, (tuple, list)) else [want]
        assert len(et) == len(host) == len(want), (len(et), len(host), len(want))
        for k, (e, h, w, step) in enumerate(zip(et, host, want, steps)):
            self.assert_matches(h, w, step, f"output {k}: tosakit run vs PyTorch")
            if whole_in_executorch:
                self.assert_matches(e, w, step, f"output {k}: ExecuTorch vs PyTorch")
                self.assert_matches(h, e, step, f"output {k}: tosakit run vs ExecuTorch")
            else:
                assert e.dtype == h.dtype and e.shape == h.shape and bool(torch.isfinite(e.double()).all()), \
                    f"output {k}: ExecuTorch gave {e.dtype}{list(e.shape)}, tosakit run {h.dtype}{list(h.shape)}"

    def bundled_run(self, compiled, inputs, host, steps, whole: bool) -> list:
        """The program as a .bpte (its inputs; tosakit run's outputs as the ones expected): ExecuTorch's runtime
        loads the bundled inputs, runs them and its verify passes at the tolerance ``assert_matches`` allows
        between the two runtimes (anything, when the values are judged per layer); its serializer reads every
        value back as written (bundles under READ_BACK_BYTES: it converts through JSON). ExecuTorch's outputs."""
        import torch

        from tosakit.program.bundled import (BundledProgram, MethodTestCase, MethodTestSuite,
                                             serialize_from_bundled_program_to_flatbuffer)

        case = MethodTestCase(list(inputs), list(host))
        path = self.folder / f"bundle{len(list(self.folder.glob('*.bpte')))}.bpte"
        path.write_bytes(serialize_from_bundled_program_to_flatbuffer(
            BundledProgram(compiled.program, [MethodTestSuite("forward", [case])])))
        limits = [step * 1.001 + 1e-6 if step else self.RTOL * max(1.0, float(h.double().abs().max()))
                  for h, step in zip(host, steps)]
        read_back = path.stat().st_size < READ_BACK_BYTES
        result = self.oracle.bundled(path, atol=max(limits) if whole else float("inf"), rtol=0.0,
                                     read_back=read_back, suites=[["forward", 1]])
        assert result["verified"] == [["forward", 0, True, ""]], result["verified"]
        values = result["values"]
        for kind, tensors in (("in", inputs), ("out", host)) if read_back else ():
            for i, t in enumerate(tensors):
                assert np.array_equal(values[f"s0_c0_{kind}{i}"], t.numpy()), (kind, i)
        return [torch.from_numpy(values[f"s0_c0_got{i}"]) for i in range(len(host))]

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

