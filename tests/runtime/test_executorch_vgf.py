"""ExecuTorch 1.5.1's own VGF programs (its VGF tutorial flow: VgfQuantizer, VgfPartitioner, the model converter)
run by `tosakit run` on the VGF engine: each delegate equal to ExecuTorch's TOSA for it on the reference model, and
the outputs equal to tosakit's own program for the very quantized graph ExecuTorch lowered."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from support.shared import made_once, run_folder
from tosakit.capture import export
from tosakit.flow import partitioner_for
from tosakit.program import to_edge_transform_and_lower
from tosakit.program.pte import tosa_key
from tosakit.runtime import LoadedProgram, load
from tosakit.specs import VgfCompileSpec
from tosakit.zoo import MODELS

pytestmark = pytest.mark.numerics



def _attention():
    """One transformer encoder layer (self-attention, layer norms, a GELU MLP) over 8 tokens of 16 features."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, activation="gelu", batch_first=True)
    return layer.eval(), (torch.randn(1, 8, 16),)


# The tutorial's add, a convolutional network and attention (small: ExecuTorch's VGF export is the slow part).
FACTORIES = {"add": MODELS["add"].factory, "mv2": MODELS["mv2"].factory, "attention": _attention}


@pytest.fixture(scope="session")
def exported_vgf(et_oracle, tmp_path_factory):
    """name -> (example inputs, et_export.py's result for target vgf), exported once per test run."""
    def export_into(name: str, folder: Path) -> None:
        module, inputs = FACTORIES[name]()
        result = et_oracle.export_ethosu(module.eval(), inputs, folder, name=name, target="vgf",
                                         bundleio=name == "mv2")
        (folder / "result.json").write_text(json.dumps(result))

    def get(name: str):
        folder = made_once(run_folder(tmp_path_factory) / f"executorch_{name}_vgf", lambda f: export_into(name, f))
        return tuple(torch.load(folder / f"{name}.inputs.pt")), json.loads((folder / "result.json").read_text())

    return get


@pytest.mark.parametrize("name", list(FACTORIES))
def test_executorch_vgf_program_runs_on_the_vgf_engine(name, exported_vgf, vgf_stack):
    """No TOSA inside ExecuTorch's .pte: every delegate runs its VGF payload on the stack, bit-exact with
    ExecuTorch's TOSA for it on the reference model; tosakit's program for the same quantized graph gives the same
    outputs."""
    inputs, result = exported_vgf(name)
    program = load(result["pte"])
    delegates = program.plan().delegates
    assert delegates and all(d.id == "VgfBackend" and not program.carries_tosa(d) for d in delegates)
    assert len(program.layouts["forward"].delegate_vgf) == len(delegates)
    tosa = {d["payload_sha256"]: Path(d["tosa"]).read_bytes() for d in result["delegates"]}
    carried = {tosa_key(blob): tosa[hashlib.sha256(blob).hexdigest()]
               for blob in (program.delegate_payload(d) for d in delegates)}
    outputs, comparisons = load(result["pte"], tosa=carried).run_and_compare(list(inputs))
    assert len(comparisons) >= len(delegates) and all(c.bit_exact for c in comparisons), \
        [str(c) for c in comparisons]

    graph = torch.export.load(result["quantized"]).module(check_guards=False)
    for node in graph.graph.nodes:  # ExecuTorch's alias of slice (see test_executorch_ethosu)
        if node.target is torch.ops.aten.slice_copy.Tensor:
            node.target = torch.ops.aten.slice.Tensor
    graph.recompile()
    edge = to_edge_transform_and_lower(export(graph, tuple(inputs)), partitioner=[partitioner_for(VgfCompileSpec())])
    mine = LoadedProgram(edge.to_executorch().buffer, f"{name}_tosakit.pte").run(list(inputs))
    assert len(mine) == len(outputs)
    for k, (m, e) in enumerate(zip(mine, outputs)):
        assert m.dtype == e.dtype and torch.equal(m, e), (k, float((m.double() - e.double()).abs().max()))


def test_executorch_bundled_mv2_checks_under_tosakit_run_vgf(exported_vgf, vgf_stack, capsys):
    """aot_arm_compiler --bundleio's mv2 for VGF, its delegate on the VGF engine, checked as the Arm runner checks
    it (see check_executorch_bundle; the VGF payload dequantizes inside, so the step is the Ethos-U program's)."""
    from support.bundles import check_executorch_bundle

    _, result = exported_vgf("mv2")
    check_executorch_bundle(Path(result["pte"]).with_suffix(".bpte"), capsys, 0.0)
