"""`make bench -- sweep-field`: the field's standard networks, picked by rules, compiled side by side by tosakit and
ExecuTorch 1.5.1 (the same exported graph, the same Vela and system configuration) for ethos-u55-128 and ethos-u85-256.

Rules: every torchvision classification, segmentation and dense-head detection model up to MAC_BUDGET multiply-
accumulates at its standard input (its default weights' crop, or resize, size; a detector's transform size); for timm,
per architecture family (its module and the name's leading word), the family's model with the fewest MACs at its
default input, kept when that is at most TIMM_BUDGET (timm's test_* fixtures left out); every tiny Hugging Face configuration tosakit builds
(``hf:tiny/NAME``, int64 token ids for text). MACs are counted on the meta device (no weights, no run).

Each model runs in its own process (several at once, within the machine's memory); its row is a file in
bench/out/sweep/rows, so a stopped sweep resumes where it stopped. ExecuTorch's side is computed once per model and
kept in bench/out/sweep/executorch (never recomputed unless that file is deleted). A failure is a row, not a crash."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out" / "sweep"
TARGETS = (("ethos-u55-128", "Shared_Sram"), ("ethos-u85-256", "Sram_Only"))
MAC_BUDGET = 5.0e9
TIMM_BUDGET = 0.6e9  # the "mobile" budget of the efficient-network papers
MODEL_TIMEOUT = 3600  # seconds for one model, both compilers, both targets
PROCESS_MEMORY = 6 << 30  # what one model's process may take, for how many run at once
_BOUNDARY = ("quantize_per_tensor", "dequantize_per_tensor", "executorch_call_delegate", "getitem")


def _key(spec: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", spec)


def _macs(module, inputs, meta: bool = True) -> int:
    """Multiply-accumulates of one forward pass, counted on the meta device (torch's flop counter / 2); with
    ``meta=False`` run for real (a model that reads its input's values)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    if meta:
        module, inputs = module.to("meta"), [torch.empty(x.shape, dtype=x.dtype, device="meta") for x in inputs]
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        module(*inputs)
    return counter.get_total_flops() // 2


# ------------------------------------------------------------------ which models: rules, not a list


def _built(factory, *args):
    """``factory(*args)`` on the meta device (no weights), or for real where its initialisation reads values."""
    import torch

    try:
        with torch.device("meta"):
            return factory(*args)
    except NotImplementedError:
        return factory(*args)


def _torchvision_entries() -> list[dict]:
    import torch

    from tosakit.zoo.field import import_torchvision, load_field_model

    models = import_torchvision().models
    groups = {"classification": models, "segmentation": models.segmentation, "detection": models.detection}
    entries = []
    for family, group in groups.items():
        for name in models.list_models(module=group):
            try:
                module, (example,) = _built(load_field_model, f"torchvision:{name}")
            except Exception:  # noqa: BLE001  region-cropping detectors (roi_align): no dense head to compile
                continue
            if family == "detection":
                size = example.shape[-1]  # its transform's size
            else:
                transforms = models.get_model_weights(name).DEFAULT.transforms()
                size = (getattr(transforms, "crop_size", None) or transforms.resize_size)[0]
            try:
                macs = _macs(module, (torch.empty(1, 3, size, size),))
            except Exception:  # noqa: BLE001  built for one size (a ViT without its weights): that size
                size = example.shape[-1]
                macs = _macs(module, (example,))
            if macs <= MAC_BUDGET:
                entries.append({"spec": f"torchvision:{name}", "family": f"torchvision {family}",
                                "shape": [1, 3, size, size], "macs": macs})
    return entries


def _timm_entries() -> list[dict]:
    import torch

    from tosakit.zoo.field import import_field

    timm = import_field("timm")  # torchvision first, beside torch's CPU wheel
    from timm.models import get_pretrained_cfg
    from timm.models._registry import _model_to_module

    best: dict[str, dict] = {}
    for name in timm.list_models(exclude_filters=["test_*"]):  # timm's own test fixtures are no architecture
        family = f"{_model_to_module[name]}:{re.match(r'(?:tf_|gluon_|legacy_)?([a-z]+)', name).group(1)}"
        cfg = get_pretrained_cfg(name)
        shape = [1, *(cfg.input_size if cfg else (3, 224, 224))]
        try:
            module = _built(timm.create_model, name).eval()
            macs = _macs(module, (torch.empty(shape),))
        except Exception:  # noqa: BLE001  a model that does not build on the meta device is not counted
            continue
        if family not in best or macs < best[family]["macs"]:
            best[family] = {"spec": f"timm:{name}", "family": "timm " + family.split(":")[0], "shape": shape,
                            "macs": macs}
    return sorted((e for e in best.values() if e["macs"] <= TIMM_BUDGET), key=lambda e: e["spec"])


def _hf_entries() -> list[dict]:
    from tosakit.zoo import load_model
    from tosakit.zoo.hf_tiny import TINY

    entries = []
    for name in TINY:
        _, module, inputs = load_model(f"hf:tiny/{name}")
        entries.append({"spec": f"hf:tiny/{name}", "family": "hf", "shape": None,
                        "macs": _macs(module, inputs, meta=False)})
    return entries


SOURCES = {"torchvision": _torchvision_entries, "timm": _timm_entries, "hf": _hf_entries}


def select_models(sources=tuple(SOURCES), reselect: bool = False) -> list[dict]:
    """The sweep's models by its rules, each source's cached in bench/out/sweep/models-SOURCE.json."""
    entries = []
    for source in sources:
        path = OUT / f"models-{source}.json"
        if reselect or not path.exists():
            print(f"selecting {source} models by the sweep's rules (MACs on the meta device) ...", flush=True)
            _write(path, SOURCES[source]())
        entries += json.loads(path.read_text())
    return entries


def _write(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


# ------------------------------------------------------------------ one model, in its own process


def _kinds(targets: list[str]) -> dict[str, int]:
    """CPU ops by ATen name (no namespace, no overload: ``<EdgeOpOverload: aten.where.self>: ...`` is ``where``)."""
    kinds: dict[str, int] = {}
    for target in targets:
        match = re.match(r"(?:<EdgeOpOverload: )?[A-Za-z0-9_]+(?:\.|::)([A-Za-z0-9_]+)", target)
        op = match.group(1) if match else target.split("(")[0]
        kinds[op] = kinds.get(op, 0) + 1
    return kinds


def _figures(reports) -> dict:
    return {"cycles": sum(r.total_cycles for r in reports),
            "sram": max((r.sram_used_bytes for r in reports), default=0),
            "offchip": sum(r.offchip_used_bytes for r in reports), "macs_npu": sum(r.mac_count for r in reports),
            "delegates": len(reports)}


def _error(exc: BaseException) -> str:
    from tosakit.errors import TosakitError

    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return text if isinstance(exc, TosakitError) else f"internal {type(exc).__name__}: {text}"[:400]


def _tosakit_side(module, inputs, target: str, memory_mode: str) -> dict:
    from tosakit.flow import compile
    from tosakit.specs import EthosUCompileSpec

    start = time.perf_counter()
    try:
        compiled = compile(module, inputs, EthosUCompileSpec(target, memory_mode=memory_mode), quantize=True)
        compiled.program.buffer  # noqa: B018  the .pte is written (serialized) in the time, as ExecuTorch's is
    except Exception as exc:  # noqa: BLE001  a failure is the row's result
        return {"error": _error(exc), "seconds": time.perf_counter() - start}
    seconds = time.perf_counter() - start
    cpu = [p.target for p in compiled.edge.placements if p.placement == "cpu" and p.compute]
    return {"seconds": seconds, "cpu_kinds": _kinds(cpu), **_figures([d.report for d in compiled.edge.delegates])}


def _executorch_side(spec: str, model: Path, inputs: Path) -> dict:
    """ExecuTorch 1.5.1's compile of both targets in its side environment; its TOSA measured by the same Vela run."""
    from tosakit.backends.ethosu.vela import compile_tosa
    from tosakit.specs import EthosUCompileSpec

    from side_env import side_env

    work = OUT / "executorch-work" / _key(spec)
    jobs = [{"name": _key(spec), "model": str(model), "inputs": str(inputs), "target": t, "memory_mode": m,
             "out": str(work / t)} for t, m in TARGETS]
    _write(work / "jobs.json", jobs)
    result = {t: {"error": "ExecuTorch's process ended without a result"} for t, _ in TARGETS}
    try:
        subprocess.run([str(side_env()), str(ROOT / "bench" / "executorch_side.py"), str(work / "jobs.json"),
                        str(work / "results.json")], check=True, timeout=MODEL_TIMEOUT, capture_output=True,
                       env=dict(os.environ, PYTHONWARNINGS="ignore"))
    except subprocess.TimeoutExpired:
        return {t: {"error": f"timed out after {MODEL_TIMEOUT} s"} for t, _ in TARGETS}
    except subprocess.CalledProcessError as exc:
        tail = exc.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        how = f"killed by signal {-exc.returncode}" if exc.returncode < 0 else f"exit {exc.returncode}"
        return {t: {"error": f"process failed ({how}): {tail[0][:300]}"} for t, _ in TARGETS}
    for theirs in json.loads((work / "results.json").read_text()):
        target, memory_mode = theirs["target"], dict(TARGETS)[theirs["target"]]
        if "error" in theirs:
            result[target] = {"error": theirs["error"].splitlines()[0][:400]}
            continue
        try:
            spec_ = EthosUCompileSpec(target, memory_mode=memory_mode)
            reports = [compile_tosa(Path(t).read_bytes(), spec_).report for t in theirs["tosa"]]
        except Exception as exc:  # noqa: BLE001
            result[target] = {"error": f"its TOSA does not compile with Vela here: {_error(exc)}"}
            continue
        result[target] = {"seconds": theirs["seconds"], "cpu_kinds": _kinds(
            [op for op in theirs["cpu_ops"] if not any(b in op for b in _BOUNDARY)]), **_figures(reports)}
    return result


def measure(entry: dict) -> dict:
    """One model: exported once; tosakit and (unless cached) ExecuTorch compile that graph for both targets."""
    import torch

    from tosakit.zoo import load_model

    torch.set_num_threads(int(os.environ.get("SWEEP_THREADS", "1")))
    row = {"spec": entry["spec"], "family": entry["family"], "macs": entry["macs"]}
    model = OUT / "models" / f"{_key(entry['spec'])}.pt2"
    try:
        _, module, inputs = load_model(entry["spec"], [tuple(entry["shape"])] if entry["shape"] else None)
        model.parent.mkdir(parents=True, exist_ok=True)
        torch.export.save(torch.export.export(module.eval(), inputs), model)
        torch.save(inputs, model.with_suffix(".inputs.pt"))
        exported = torch.export.load(model).module()
    except Exception as exc:  # noqa: BLE001  a model that does not build or export: both sides fail alike
        return dict(row, error=f"the model does not build or export: {_error(exc)}")
    row["tosakit"] = {t: _tosakit_side(exported, inputs, t, m) for t, m in TARGETS}
    cached = OUT / "executorch" / f"{_key(entry['spec'])}.json"
    if not cached.exists():
        _write(cached, _executorch_side(entry["spec"], model, model.with_suffix(".inputs.pt")))
    row["executorch"] = json.loads(cached.read_text())
    return row


# ------------------------------------------------------------------ the pool


def _parallel_jobs(requested: int | None) -> int:
    if requested:
        return requested
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return max(1, min(os.cpu_count() or 1, available // PROCESS_MEMORY))


def run_sweep(entries: list[dict], jobs: int, redo_tosakit: bool) -> None:
    """Every model without a row (with ``redo_tosakit``, every model with one: tosakit's side again, ExecuTorch's
    from its cache), ``jobs`` processes at once, rows written as they end."""
    rows = OUT / "rows"
    todo = sorted((e for e in entries if (rows / f"{_key(e['spec'])}.json").exists() == redo_tosakit),
                  key=lambda e: e["macs"])  # the small first: figures sooner
    print(f"sweep: {len(entries)} models, {len(entries) - len(todo)} done before, {len(todo)} to run, {jobs} at once",
          flush=True)
    running: dict[str, tuple[subprocess.Popen, float, dict]] = {}
    env = dict(os.environ, SWEEP_THREADS=str(max(1, (os.cpu_count() or 1) // jobs)), PYTHONWARNINGS="ignore")
    done = 0
    while todo or running:
        while todo and len(running) < jobs:
            entry = todo.pop(0)
            log = open(OUT / "logs" / f"{_key(entry['spec'])}.log", "w")
            running[entry["spec"]] = (subprocess.Popen([sys.executable, __file__, "--one", json.dumps(entry)],
                                                       stdout=log, stderr=subprocess.STDOUT, env=env),
                                      time.time(), entry)
        time.sleep(1)
        for spec, (process, started, entry) in list(running.items()):
            late = time.time() - started > 2 * MODEL_TIMEOUT
            if process.poll() is None and not late:
                continue
            if late:
                process.kill()
            path = rows / f"{_key(spec)}.json"
            if process.returncode != 0 or late:
                _write(path, {"spec": spec, "family": entry["family"], "macs": entry["macs"],
                              "error": f"its process ended with {process.returncode} (bench/out/sweep/logs)"})
            del running[spec]
            done += 1
            print(f"  [{done}/{done + len(todo) + len(running)}] {spec}: {_one_line(json.loads(path.read_text()))}",
                  flush=True)


def _one_line(row: dict) -> str:
    if "error" in row:
        return row["error"][:100]
    cells = []
    for target, _ in TARGETS:
        mine, theirs = row["tosakit"][target], row["executorch"][target]
        ratio = f"{mine['cycles'] / theirs['cycles']:.2f}x" if "cycles" in mine and "cycles" in theirs else "-"
        cells.append(f"{target[6:]} {'failed' if 'error' in mine else ratio}")
    return ", ".join(cells)


def _one(entry_json: str) -> int:
    entry = json.loads(entry_json)
    row = measure(entry)
    _write(OUT / "rows" / f"{_key(entry['spec'])}.json", row)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--one"]:
        return _one(argv[1])
    import argparse

    from sweep_report import report

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, help="models at once (default: the cores, within memory)")
    parser.add_argument("--reselect", action="store_true", help="apply the selection rules again")
    parser.add_argument("--redo-tosakit", action="store_true", help="recompile every model that has a row with tosakit "
                        "(ExecuTorch's side stays cached)")
    parser.add_argument("--sources", default=",".join(SOURCES), help="which sources (default: all)")
    parser.add_argument("--only", help="comma-separated specs or substrings: run these models only (the report still covers every row)")
    parser.add_argument("--report-only", action="store_true", help="print the tables from the rows there are")
    args = parser.parse_args(argv)
    (OUT / "logs").mkdir(parents=True, exist_ok=True)
    selected = select_models(args.sources.split(","), args.reselect)
    entries = [e for e in selected if any(o in e["spec"] for o in args.only.split(","))] if args.only else selected
    if not args.report_only:
        run_sweep(entries, _parallel_jobs(args.jobs), args.redo_tosakit)
    report(OUT, [e["spec"] for e in selected], TARGETS)  # the whole sweep's files, not the --only models
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main(sys.argv[1:]))
