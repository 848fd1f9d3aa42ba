"""Named data (.ptd, ExecuTorch's FlatTensor): constants and Ethos-U blocks stored by key outside the program,
written by `compile --external-data` / ``ExecutorchBackendConfig(external_constants=...)`` /
``VelaExternalBlockPlacements``, read by `run --data`, in the layout ExecuTorch 1.5.1's runtime reads."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest
import torch
from torch import nn

from tosakit.errors import TosakitError
from tosakit.program import schema as S
from tosakit.program.ptd import NamedBlob, TensorLayout, deserialize_ptd, serialize_ptd
from tosakit.program.pte import deserialize_pte

INPUTS = (torch.randn(2, 4, generator=torch.Generator().manual_seed(1)),
          torch.randn(1, 2, 6, 6, generator=torch.Generator().manual_seed(2)))


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc, self.conv = nn.Linear(4, 3), nn.Conv2d(2, 4, 3)

    def forward(self, x, y):
        return torch.relu(self.fc(x)), self.conv(y)


def test_ptd_layout_is_executorchs_and_equal_blobs_share_a_segment():
    """FT01, then the FH01 header (length 40, flatbuffer at 48, segments at a multiple of 128); two keys with
    equal bytes name one segment; the entries read back; a blob whose bytes disagree with its layout is refused."""
    layout = TensorLayout(S.ScalarType.FLOAT, [2, 3], [0, 1])
    weights = np.arange(6, dtype=np.float32).tobytes()
    data = serialize_ptd({"a.weight": NamedBlob(weights, layout), "b.weight": NamedBlob(weights, layout),
                          "blob": NamedBlob(b"\x01\x02\x03")})
    assert data[4:8] == b"FT01" and data[8:12] == b"FH01"
    length, flat_offset, flat_size, base, size = struct.unpack_from("<IQQQQ", data, 12)
    assert (length, flat_offset, base % 128) == (40, 48, 0) and base + size == len(data)
    read = deserialize_ptd(data)
    assert read == {"a.weight": NamedBlob(weights, layout), "b.weight": NamedBlob(weights, layout),
                    "blob": NamedBlob(b"\x01\x02\x03")}
    assert size == 128 + 3  # two segments: the weights (once), then the blob at the next 128
    bad = serialize_ptd({"a.weight": NamedBlob(weights[:20], layout)})
    with pytest.raises(TosakitError, match="'a.weight' holds 20 bytes; its layout needs 24"):
        deserialize_ptd(bad)
    with pytest.raises(TosakitError, match="its segments end at byte"):
        deserialize_ptd(data[:-1])


@pytest.fixture(scope="module")
def cpu_programs(tmp_path_factory):
    """The net's float CPU program twice: constants inline, and constants in a .ptd."""
    from tosakit.flow import compile
    from tosakit.program.manager import ExecutorchBackendConfig

    folder = tmp_path_factory.mktemp("named")
    compiled = compile(_Net().eval(), INPUTS, "TOSA-1.0+FP", quantize=False, delegate=False)
    inline = compiled.program.save(folder / "inline.pte")
    external = compiled.edge.to_executorch(ExecutorchBackendConfig(external_constants=True))
    external.save(folder / "external.pte")
    [ptd] = external.write_tensor_data_to_file(folder)
    return inline, folder / "external.pte", ptd


def test_external_constants_live_in_the_ptd_by_name_fp(cpu_programs):
    """Each parameter is a tensor EXTERNAL by its graph name with no bytes in the program; the .ptd holds it
    with its layout; the program run with the .ptd gives the inline program's outputs bit for bit."""
    from tosakit.runtime import load

    inline, external, ptd = cpu_programs
    assert ptd.name == "_default_external_constant.ptd"
    program, _ = deserialize_pte(external.read_bytes())
    named = {v.val.extra_tensor_info.fully_qualified_name: v.val for v in program.execution_plan[0].values
             if isinstance(v.val, S.Tensor) and v.val.extra_tensor_info is not None}
    assert set(named) == {"fc.weight", "fc.bias", "conv.weight", "conv.bias"}
    assert all(t.extra_tensor_info.location == S.TensorDataLocation.EXTERNAL and t.data_buffer_idx == 0
               for t in named.values())
    entries = deserialize_ptd(ptd.read_bytes())
    assert entries["conv.weight"].layout == TensorLayout(S.ScalarType.FLOAT, [4, 2, 3, 3], [0, 1, 2, 3])
    assert external.stat().st_size < inline.stat().st_size - 4 * (12 + 3 + 72 + 4) + 512
    want = load(inline).run(INPUTS)
    got = load(external, data=ptd).run(INPUTS)
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_a_missing_or_mismatched_ptd_is_refused_naming_the_constant_fp(cpu_programs, tmp_path):
    from tosakit.runtime import load

    _, external, ptd = cpu_programs
    with pytest.raises(TosakitError, match="reads constant 'fc.weight' from a data file, and no data file given"):
        load(external)
    with pytest.raises(TosakitError, match="none.ptd not found") as missing:
        load(external, data=tmp_path / "none.ptd")
    assert missing.value.hint == "give the path of a .ptd file"
    entries = deserialize_ptd(ptd.read_bytes())
    entries["fc.weight"] = NamedBlob(bytes(4 * 12), TensorLayout(S.ScalarType.INT, [3, 4], [0, 1]))
    (tmp_path / "wrong.ptd").write_bytes(serialize_ptd(entries))
    with pytest.raises(TosakitError, match=r"FLOAT\[3, 4\] .*'fc.weight' is INT\[3, 4\]"):
        load(external, data=tmp_path / "wrong.ptd")


def test_ethos_u_blocks_placed_in_a_ptd_run_bit_exact_u55(tmp_path):
    """VelaExternalBlockPlacements: the payload keeps each placed block as its key, sha256(tag NUL data) in hex,
    flagged external (ExecuTorch's layout); the compile spec says where; `<tag>.ptd` holds the blocks; the
    program run with it equals the inline program."""
    from tosakit.backends.ethosu.payload import external_key
    from tosakit.flow import compile
    from tosakit.runtime import load
    from tosakit.specs import EthosUCompileSpec, VelaExternalBlockPlacements

    conv = nn.Sequential(nn.Conv2d(2, 4, 3), nn.ReLU()).eval()
    inline = compile(conv, INPUTS[1:], "ethos-u55-128", quantize=True).program.save(tmp_path / "inline.pte")
    spec = EthosUCompileSpec("ethos-u55-128", external_block_placements=VelaExternalBlockPlacements("npu", "npu"))
    compiled = compile(conv, INPUTS[1:], spec, quantize=True)
    placed = compiled.program
    placed.save(tmp_path / "placed.pte")
    [ptd] = placed.write_tensor_data_to_file(tmp_path)
    delegate = deserialize_pte((tmp_path / "placed.pte").read_bytes())[0].execution_plan[0].delegates[0]
    assert any(s.key == "external_block_placements" and s.value == b'{"cmd_data":"npu","weight_data":"npu"}'
               for s in delegate.compile_specs)
    entries = deserialize_ptd(ptd.read_bytes())
    assert len(entries) == 2 and all(key == external_key("npu", blob.data) == hashlib.sha256(
        b"npu\0" + blob.data).hexdigest() and blob.layout is None for key, blob in entries.items())
    assert (tmp_path / "placed.pte").stat().st_size + ptd.stat().st_size > inline.stat().st_size
    want = load(inline).run(INPUTS[1:])
    assert torch.equal(load(tmp_path / "placed.pte", data=ptd).run(INPUTS[1:])[0], want[0])
    with pytest.raises(TosakitError, match="block 'cmd_data' keeps its data outside the payload"):
        load(tmp_path / "placed.pte")
    # kept in the program, a block only one payload names goes back inline: the payload any runtime reads
    from tosakit.backends.ethosu.payload import parse_payload
    from tosakit.program.emit import program_from_methods

    edge = compiled.edge.program
    alone = program_from_methods({"forward": (edge.graph_module, edge.in_spec, edge.out_spec)}, blocks_in_program=True)
    assert not alone.program.named_data and not alone.external
    assert parse_payload(alone.program.backend_delegate_data[0].data).cmd_data


@pytest.mark.oracle
def test_executorch_runs_a_program_whose_constants_are_in_tosakits_ptd_fp(cpu_programs, et_oracle):
    """ExecuTorch 1.5.1's runtime loads the .pte with tosakit's .ptd (load_program(..., data_path=...)) and gives
    the float model's outputs."""
    _, external, ptd = cpu_programs
    got = et_oracle.run(external, INPUTS, data=ptd)
    with torch.no_grad():
        want = _Net().eval()(*INPUTS)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-5, atol=1e-6)


def test_damaged_ptd_files_are_refused_or_read_never_crash_fp(cpu_programs, tmp_path):
    """300 seeded mutations of the .ptd (bytes flipped, cut short, grown): each loads with its layouts checked,
    or is refused with a TosakitError; nothing else escapes, and a program that loads runs."""
    import random

    from tosakit.runtime import load

    _, external, ptd = cpu_programs
    data, rng, refused = ptd.read_bytes(), random.Random(0), 0
    for k in range(300):
        damaged = bytearray(data)
        kind = k % 3
        if kind == 0:
            for _ in range(rng.randint(1, 8)):
                damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        elif kind == 1:
            damaged = damaged[:rng.randrange(len(damaged))]
        else:
            damaged[rng.randrange(64)] = rng.randrange(256)
            damaged += bytes(rng.randrange(300))
        (tmp_path / "d.ptd").write_bytes(bytes(damaged))
        try:
            load(external, data=tmp_path / "d.ptd").run(INPUTS)
        except TosakitError:
            refused += 1
    assert 100 < refused < 300


@pytest.mark.oracle
def test_executorch_placed_blocks_run_from_its_ptd_u55(et_oracle, tmp_path):
    """ExecuTorch 1.5.1's Ethos-U backend with VelaExternalBlockPlacements: its payload's external blocks name keys
    tosakit derives alike (sha256 of tag NUL bytes), and `tosakit run --data` simulates its program from its .ptd
    bit-exact with ExecuTorch's TOSA for the delegate on the reference model."""
    from pathlib import Path

    from tosakit.backends.ethosu.payload import external_key
    from tosakit.program.pte import tosa_key
    from tosakit.runtime import load

    torch.manual_seed(0)
    conv = nn.Sequential(nn.Conv2d(2, 4, 3), nn.ReLU()).eval()
    placed = et_oracle.export_ethosu(conv, INPUTS[1:], tmp_path, name="conv", external_blocks="npu")
    ptd = tmp_path / "npu.ptd"
    entries = deserialize_ptd(ptd.read_bytes())
    assert len(entries) == 2 and all(key == external_key("npu", blob.data) for key, blob in entries.items())
    program = load(placed["pte"], data=ptd)
    [delegate], [made] = program.plan().delegates, placed["delegates"]
    carried = {tosa_key(program.delegate_payload(delegate)): Path(made["tosa"]).read_bytes()}
    _, comparisons = load(placed["pte"], tosa=carried, data=ptd).run_and_compare(list(INPUTS[1:]))
    assert comparisons and all(c.bit_exact for c in comparisons), [str(c) for c in comparisons]
