"""`tosakit inspect FILE --explore`: the program in Google's Model Explorer with each Ethos-U delegate's TOSA drawn by
Arm's adapter, and where the time goes (placement, estimated cycles, the NPU's counters) as node overlays; rendered
in a real headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from support.npu import NpuWorkNet

from tosakit.errors import TosakitError


_saved: dict = {}


def _pte(folder: Path, debug_info: bool, target: str = "ethos-u55-128") -> Path:
    """The net compiled for ``target`` (carrying its TOSA with ``debug_info``), saved once per test process."""
    from tosakit.flow import compile
    from tosakit.specs import EthosUCompileSpec

    key = (debug_info, target)
    if key not in _saved:
        torch.manual_seed(0)
        inputs = (torch.randn(1, 8, 16, 16),)
        compiled = compile(NpuWorkNet().eval(), inputs, EthosUCompileSpec(target).with_debug_info(debug_info),
                           quantize=True, calibration=[inputs])
        _saved[key] = compiled.program.save(folder / f"net_{target}_{int(debug_info)}.pte")
    return _saved[key]


def _exploration(pte: Path, folder: Path):
    """What --explore writes for ``pte``, and the profiled run it comes from."""
    from tosakit.cli_commands import _labels, _operation_maps
    from tosakit.runtime import load
    from tosakit.runtime.io import random_inputs
    from tosakit.runtime.profile import program_profile
    from tosakit.verify.explore import write_exploration

    program = load(pte)
    _, steps = program.run_profiled(random_inputs([(s.dtype, s.shape) for s in program.input_specs()], seed=0))
    maps = _operation_maps(program, steps)
    profile = program_profile(program.plan(), steps, labels=_labels(maps))
    return write_exploration(folder, pte.stem, program.plan(), profile, maps), profile


def _overlays(exploration) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p, _ in exploration.overlays}


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"])
def test_tosa_overlays_are_the_profile_keyed_by_arms_adapter_int(tmp_path, target):
    """Every overlay key of a delegate's TOSA is a node Arm's adapter draws (``main/op<k>``), every operator but the
    constants is placed, and per counter the operators' values add up to the stream's total exactly (each
    command's bytes counted once); the estimated cycles add up to the compute engine's time (``_u55``/``_u85``)."""
    from tosa_adapter_model_explorer.main import TosaFlatbufferAdapter

    from tosakit.verify.explore import tosa_operators

    exploration, profile = _exploration(_pte(tmp_path, True, target), tmp_path / "explore")
    [(tosa_path, adapter)] = exploration.models[1:]
    assert adapter == "tosa_flatbuffer_adapter"
    [graph] = TosaFlatbufferAdapter().convert(str(tosa_path), {})["graphs"]
    drawn = {node.id for node in graph.nodes}
    overlays = _overlays(exploration)
    [(_, npu)] = profile.npu
    compute = [op for op in npu.operations if op.operation != "DMA_START"]
    for name, data in overlays.items():
        if not name.startswith("delegate 0"):
            continue
        assert set(data) == {"main"} and set(data["main"]["results"]) <= drawn, name
    operators = tosa_operators(tosa_path.read_bytes())
    placed = overlays["delegate 0 - placement"]["main"]["results"]
    assert set(placed) == {f"main/op{k}" for k, op in enumerate(operators) if not op.startswith("CONST")}
    npu_placed = {k for k, r in placed.items() if r["value"] == "NPU"}
    assert {operators[int(k.removeprefix("main/op"))] for k in npu_placed} >= {"CONV2D", "DEPTHWISE_CONV2D",
                                                                                "ADD", "AVG_POOL2D"}
    for counter, total in npu.counters().items():
        if counter in ("NPU_ACTIVE", "NPU_IDLE") or not total:
            continue
        values = overlays[f"delegate 0 - {counter}"]["main"]["results"]
        assert sum(r["value"] for r in values.values()) == total, counter
    cycles = sum(r["value"] for r in overlays["delegate 0 - estimated cycles"]["main"]["results"].values())
    assert cycles == max(op.end for op in compute) and set(
        overlays["delegate 0 - estimated cycles"]["main"]["results"]) == npu_placed
    assert sum(r["value"] for r in overlays["delegate 0 - MACs"]["main"]["results"].values()) == \
        sum(op.macs for op in npu.operations)


def test_program_graph_places_each_call_fp(tmp_path):
    """The program's graph: its kernel and delegate calls joined by the values between them, each placed (CPU, NPU)
    and timed as the profile's timeline; a delegate that carries no TOSA is drawn as its command stream's
    operations, each with its estimated cycles."""
    exploration, profile = _exploration(_pte(tmp_path, False), tmp_path / "explore")
    assert len(exploration.models) == 1 and exploration.shown is None
    collection = json.loads(exploration.models[0][0].read_text())
    assert collection["label"] == exploration.models[0][0].name
    program, stream = collection["graphs"]
    nodes = {n["id"]: n for n in program["nodes"]}
    assert [n["label"] for n in program["nodes"]] == [
        "Inputs", "quantized_decomposed::quantize_per_tensor.out", "EthosUBackend (delegate 0)",
        "quantized_decomposed::dequantize_per_tensor.out", "Outputs"]
    assert [e["sourceNodeId"] for e in nodes["i1"]["incomingEdges"]] == ["i0"]
    assert [e["sourceNodeId"] for e in nodes["outputs"]["incomingEdges"]] == ["i2"]
    overlays = _overlays(exploration)
    assert {k: r["value"] for k, r in overlays["forward - placement"]["forward"]["results"].items()} == {
        "i0": "CPU", "i1": "NPU", "i2": "CPU"}
    time_us = overlays["forward - estimated time (us)"]["forward"]["results"]
    assert sum(r["value"] for r in time_us.values()) == pytest.approx(profile.total_us, abs=1e-2)
    [(_, npu)] = profile.npu
    assert [n["id"] for n in stream["nodes"]] == [f"op{op.index}" for op in npu.operations]
    cycles = overlays["delegate 0 - estimated cycles"]["delegate 0 stream"]["results"]
    assert {k: r["value"] for k, r in cycles.items()} == {f"op{op.index}": op.cycles for op in npu.operations}


def test_explore_refuses_without_model_explorer(tmp_path, monkeypatch):
    """--explore with Model Explorer or Arm's TOSA adapter missing: one line that says what to install."""
    import importlib.util

    from tosakit.verify.explore import check_explorer

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tosa_adapter_model_explorer" else real(name, *a))
    with pytest.raises(TosakitError, match=r"tosa_adapter_model_explorer is not installed") as info:
        check_explorer()
    assert "tosakit[explore]" in info.value.hint


def test_explore_refuses_a_file_as_its_folder(tmp_path, capsys):
    """--explore-dir naming a file: one line naming it, before the program runs."""
    from tosakit.cli import main

    taken = tmp_path / "taken"
    taken.write_text("x")
    assert main(["inspect", str(_pte(tmp_path, False)), "--explore", "--explore-dir", str(taken)]) == 2
    assert f"--explore-dir {taken} is a file, not a folder" in capsys.readouterr().err
    assert taken.read_text() == "x"


def test_explore_names_a_port_in_use(tmp_path):
    """A --port something else listens on: an error naming the port, no server left behind."""
    import socket

    from tosakit.verify.explore import serve

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(TosakitError, match=f"127.0.0.1:{port}.*already in use"):
            serve("127.0.0.1", port)


def _chromium() -> str | None:
    """Chromium's own binary (Debian's /usr/bin/chromium is a wrapper script), or TOSAKIT_CHROMIUM."""
    for path in (os.environ.get("TOSAKIT_CHROMIUM"), "/usr/lib/chromium/chromium", shutil.which("chromium"),
                 shutil.which("chromium-browser")):
        if path and os.access(path, os.X_OK):
            return path
    return None


def _require_browser() -> str:
    """Chromium's binary, or a skip saying what is missing: only off CI (CI runs as root, where `make setup`
    installs Chromium and Playwright, so there a missing one fails), as for the VGF engine's stack."""
    import importlib.util

    chromium = _chromium()
    found = (("Chromium", chromium), ("Playwright", importlib.util.find_spec("playwright")))
    missing = [name for name, ok in found if not ok]
    if missing:
        why = f"no {' and no '.join(missing)} here (make setup installs Debian's chromium when root, and Playwright)"
        if os.geteuid() == 0:
            pytest.fail(why)
        pytest.skip(why)
    return chromium


@pytest.mark.slow
def test_explore_renders_overlays_in_headless_chromium_int(tmp_path):
    """`tosakit inspect X.pte --explore` end to end: its server started, its page rendered by Chromium (WebGL on
    SwiftShader): the TOSA graph open on its heaviest operator, the overlay runs listed, that operator's placement
    and estimated cycles in its node panel, and the graph drawn in the estimated-cycles colours (the heaviest
    operator at the gradient's top)."""
    chromium = _require_browser()
    from playwright.sync_api import sync_playwright

    pte = _pte(tmp_path, True)
    exploration, _ = _exploration(pte, tmp_path / "expected")
    cycles = json.loads((tmp_path / "expected" / "delegate 0 - estimated cycles.json").read_text())["main"]["results"]
    heaviest = exploration.shown[2]
    command = [sys.executable, "-m", "tosakit", "inspect", str(pte), "--explore", "--explore-dir",
               str(tmp_path / "explore")]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = _url(server)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=[
                "--no-sandbox", "--disable-dev-shm-usage", "--use-angle=swiftshader", "--enable-unsafe-swiftshader"])
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(url + "&test_mode=1")
            page.wait_for_selector("webgl-renderer canvas", timeout=90_000)
            page.wait_for_function("!document.body.innerText.includes('Processing graph')", timeout=90_000)
            page.wait_for_function(f"document.body.innerText.includes('{heaviest}')", timeout=30_000)
            time.sleep(1.5)
            text = page.inner_text("body")
            page.screenshot(path=str(tmp_path / "explore.png"))
            browser.close()
    finally:
        server.send_signal(signal.SIGTERM)
        said = server.communicate(timeout=30)[0]
    assert server.returncode == 0, said
    assert "WebGL" not in text, text[:500]
    assert "NODE DATA PROVIDERS" in text and "delegate 0 - esti" in text and "delegate 0 - pla" in text, text[:2000]
    words = " ".join(text.split())
    assert f"id {heaviest}" in words, words[:2000]
    panel = words[words.index("NODE DATA PROVIDERS"):words.index("INPUTS")]  # the selected operator's values
    assert "NPU" in panel and f" {cycles[heaviest]['value']} " in panel, panel
    assert _top_colour_pixels(tmp_path / "explore.png") > 200


def _url(server: subprocess.Popen) -> str:
    """The page --explore prints, once its server answers."""
    said = []
    for line in server.stdout:
        said.append(line)
        if line.startswith("Model Explorer: "):
            return line.removeprefix("Model Explorer: ").strip()
    raise AssertionError("".join(said[-20:]))


def _top_colour_pixels(png: Path) -> int:
    """How many pixels of the graph (the left pane) have the estimated-cycles gradient's top colour, #e0301e."""
    import matplotlib.image

    image = (matplotlib.image.imread(str(png))[:, :, :3] * 255).astype(np.int16)
    graph = image[:, : image.shape[1] * 7 // 10]
    return int((np.abs(graph - np.array([0xE0, 0x30, 0x1E])).max(axis=-1) <= 6).sum())
