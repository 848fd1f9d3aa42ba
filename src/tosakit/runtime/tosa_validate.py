"""TOSA flatbuffers from a file, checked before the reference model reads them: every table, vector,
string and union of the schema tosa-tools ships (``tosa.fbs``) walked with its bounds checked, then the
graph's own consistency — shapes, constant data, tensor names, memory."""

from __future__ import annotations

import functools
import importlib.util
import math
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TosakitError

SCALARS = {"bool": "?", "byte": "b", "int8": "b", "ubyte": "B", "uint8": "B", "short": "h", "int16": "h",
           "ushort": "H", "uint16": "H", "int": "i", "int32": "i", "uint": "I", "uint32": "I", "long": "q",
           "int64": "q", "ulong": "Q", "uint64": "Q", "float": "f", "float32": "f", "double": "d", "float64": "d"}
# bits per element of each DType's constant data (sub-byte types packed)
DTYPE_BITS = {"BOOL": 8, "INT4": 4, "INT8": 8, "INT16": 16, "INT32": 32, "INT48": 48, "FP32": 32, "FP16": 16,
              "BF16": 16, "SHAPE": 64, "FP8E4M3": 8, "FP8E5M2": 8, "FP6E2M3": 6, "FP6E3M2": 6, "FP4E2M1": 4,
              "FP8UE8M0": 8, "INT64": 64, "MXINT8": 8}
MAX_RANK = 6  # TOSA 1.0
MAX_TABLES = 1_000_000


@dataclass(frozen=True)
class Schema:
    """tosa.fbs as data: enums (name -> {value: label} and storage format), unions, tables (fields by slot)."""

    enums: dict[str, tuple[str, dict[int, str]]]
    unions: dict[str, list[str]]
    tables: dict[str, list[tuple[str, int, str, bool]]]  # (field, slot, type text, required)
    root: str


def _fbs_path() -> Path:
    spec = importlib.util.find_spec("tosa")
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location).parent / "bin" / "tosa.fbs"
        if path.is_file():
            return path
    raise TosakitError("the installed tosa-tools has no bin/tosa.fbs to check TOSA graphs against",
                       "reinstall the pinned stack: rm -rf .venv && make setup")


@functools.lru_cache(maxsize=None)
def tosa_schema() -> Schema:
    """The TOSA schema of the pinned tosa-tools, read from its ``tosa.fbs``."""
    text = re.sub(r"//[^\n]*", "", _fbs_path().read_text())
    enums, unions, tables = {}, {}, {}
    for kind, name, base, body in re.findall(r"\b(enum|union|table)\s+(\w+)\s*(?::\s*(\w+))?\s*\{([^}]*)\}", text):
        if kind == "enum":
            labels, value = {}, -1
            for item in filter(None, (s.strip() for s in body.split(","))):
                label, _, explicit = (p.strip() for p in item.partition("="))
                value = int(explicit, 0) if explicit else value + 1
                labels[value] = label
            enums[name] = (SCALARS[base], labels)
        elif kind == "union":
            unions[name] = [s.strip() for s in body.split(",") if s.strip()]
        else:
            rows, slot = [], 0
            for item in filter(None, (s.strip() for s in body.split(";"))):
                fname, _, rest = (p.strip() for p in item.partition(":"))
                ftype = re.split(r"[\s(=]", rest, maxsplit=1)[0]
                rows.append((fname, slot, ftype, "required" in rest))
                slot += 2 if ftype in unions else 1
            tables[name] = rows
    root = re.search(r"root_type\s+(\w+)", text)
    return Schema(enums, unions, tables, root.group(1) if root else "TosaGraph")


def _bad(where: str, what: str) -> TosakitError:
    return TosakitError(f"TOSA graph {where}: {what}", "the delegate's TOSA is damaged: re-export the program")


@dataclass
class _Walker:
    """Decodes a flatbuffer into dicts, every read bounds-checked (the flatbuffers verifier's rules)."""

    data: bytes
    schema: Schema
    where: str
    tables: int = 0

    def unpack(self, fmt: str, pos: int, what: str):
        if pos < 0 or pos + struct.calcsize(fmt) > len(self.data):
            raise _bad(self.where, f"{what} at byte {pos} lies outside its {len(self.data)} bytes")
        return struct.unpack_from("<" + fmt, self.data, pos)[0]

    def follow(self, pos: int, what: str) -> int:
        return pos + self.unpack("I", pos, what)

    def vector(self, pos: int, width: int, what: str) -> tuple[int, int]:
        start = self.follow(pos, what)
        n = self.unpack("I", start, what)
        if start + 4 + n * width > len(self.data):
            raise _bad(self.where, f"{what} claims {n} elements, past the end of the graph")
        return start + 4, n

    def table(self, name: str, pos: int, depth: int = 0) -> dict:
        self.tables += 1
        if self.tables > MAX_TABLES or depth > 64:
            raise _bad(self.where, "nests or repeats tables beyond any real graph")
        vtable = pos - self.unpack("i", pos, name)
        vsize = self.unpack("H", vtable, f"{name} vtable")
        if vsize < 4 or vsize % 2:
            raise _bad(self.where, f"{name} has a {vsize}-byte vtable")
        self.unpack("H", vtable + vsize - 2, f"{name} vtable")
        tsize = self.unpack("H", vtable + 2, f"{name} vtable")
        self.unpack("B", pos + max(tsize, 4) - 1, name)
        out = {}
        for fname, slot, ftype, required in self.schema.tables[name]:
            at = self._slot(vtable, vsize, slot, pos)
            what = f"{name}.{fname}"
            if ftype in self.schema.unions:
                tag = self.unpack("B", at, what) if at else 0
                value_at = self._slot(vtable, vsize, slot + 1, pos)
                members = self.schema.unions[ftype]
                if tag > len(members) or (tag and not value_at):
                    raise _bad(self.where, f"{what} has union type {tag} of 1..{len(members)}")
                out[fname] = (members[tag - 1], self.table(members[tag - 1], self.follow(value_at, what), depth + 1)) if tag else None
            elif not at:
                if required:
                    raise _bad(self.where, f"{what} is missing")
                out[fname] = None
            else:
                out[fname] = self.value(ftype, at, what, depth)
        return out

    def _slot(self, vtable: int, vsize: int, slot: int, pos: int) -> int:
        if 4 + 2 * slot + 2 > vsize:
            return 0
        offset = self.unpack("H", vtable + 4 + 2 * slot, "vtable")
        return pos + offset if offset else 0

    def value(self, ftype: str, at: int, what: str, depth: int):
        if ftype in SCALARS:
            return self.unpack(SCALARS[ftype], at, what)
        if ftype in self.schema.enums:
            fmt, labels = self.schema.enums[ftype]
            raw = self.unpack(fmt, at, what)
            if raw not in labels:
                raise _bad(self.where, f"{what} is {raw}, not a {ftype}")
            return labels[raw]
        if ftype == "string":
            start, n = self.vector(at, 1, what)
            try:
                return self.data[start:start + n].decode("utf-8")
            except UnicodeDecodeError:
                raise _bad(self.where, f"{what} is not UTF-8") from None
        if ftype.startswith("["):
            inner = ftype[1:-1]
            if inner in ("ubyte", "uint8", "byte", "int8"):
                start, n = self.vector(at, 1, what)
                return memoryview(self.data)[start:start + n]
            if inner in SCALARS:
                start, n = self.vector(at, struct.calcsize(SCALARS[inner]), what)
                return list(struct.unpack_from(f"<{n}{SCALARS[inner]}", self.data, start))
            start, n = self.vector(at, 4, what)
            return [self.value(inner, start + 4 * i, what, depth) if inner == "string"
                    else self.table(inner, self.follow(start + 4 * i, what), depth + 1) for i in range(n)]
        if ftype in self.schema.tables:
            return self.table(ftype, self.follow(at, what), depth + 1)
        raise _bad(self.where, f"{what} has type {ftype}, which tosa.fbs does not define")


@dataclass(frozen=True)
class TosaTensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str  # DType label: INT8, FP32, ...


@dataclass
class TosaSummary:
    """What the host runtime needs to know of a checked graph: its main block's I/O and total tensor bytes."""

    inputs: list[TosaTensorInfo] = field(default_factory=list)
    outputs: list[TosaTensorInfo] = field(default_factory=list)
    tensor_bytes: int = 0


def check_tosa(data: bytes, where: str, max_bytes: int) -> TosaSummary:
    """Check a TOSA flatbuffer whole; its I/O and memory, or a TosakitError naming what is wrong."""
    data = bytes(data)
    if len(data) < 8 or data[4:8] != b"TOSA":
        raise _bad(where, f"is not a TOSA flatbuffer (identifier {data[4:8]!r}, expected b'TOSA')")
    walker = _Walker(data, tosa_schema(), where)
    graph = walker.table(walker.schema.root, walker.follow(0, "root offset"))
    regions = graph.get("regions") or []
    if not regions or not (regions[0].get("blocks") or []):
        raise _bad(where, "has no main region with a basic block")
    summary = TosaSummary()
    for region in regions:
        for block in region.get("blocks") or []:
            summary.tensor_bytes += _check_block(block, f"{where}, block {block.get('name')!r}", max_bytes)
    if summary.tensor_bytes > max_bytes:
        raise TosakitError(f"TOSA graph {where} holds {summary.tensor_bytes} bytes of tensors, more than the "
                           f"{max_bytes}-byte memory limit", "raise the limit (--max-memory) if you trust the file")
    main = regions[0]["blocks"][0]
    tensors = {t["name"]: t for t in main.get("tensors") or []}
    for kind in ("inputs", "outputs"):
        for name in main.get(kind) or []:
            if name not in tensors:
                raise _bad(where, f"main block {kind[:-1]} {name!r} is not a tensor")
            t = tensors[name]
            getattr(summary, kind).append(TosaTensorInfo(name, tuple(t.get("shape") or []), t["type"]))
    return summary


def _check_block(block: dict, where: str, max_bytes: int) -> int:
    """Tensors well-formed and named uniquely, every operand named; the block's tensor bytes."""
    names, total = set(), 0
    for t in block.get("tensors") or []:
        name, shape, dtype = t.get("name") or "", t.get("shape") or [], t.get("type") or "UNKNOWN"
        if name in names:
            raise _bad(where, f"names tensor {name!r} twice")
        names.add(name)
        if len(shape) > MAX_RANK or any(d < 0 for d in shape) or dtype not in DTYPE_BITS:
            raise _bad(where, f"tensor {name!r} has shape {shape} of {dtype} (TOSA allows rank <= {MAX_RANK}, "
                              f"sizes >= 0, a known type)")
        nbytes = math.ceil(math.prod(shape) * DTYPE_BITS[dtype] / 8)
        total += nbytes
        if total > max_bytes:
            raise TosakitError(f"TOSA graph {where}: tensor {name!r} {shape} brings its tensors past the "
                               f"{max_bytes}-byte memory limit", "raise the limit (--max-memory) if you trust the file")
        stored = t.get("data")
        if (t.get("offset") or 0) > 1 or (t.get("size") or 0) > 1:
            raise _bad(where, f"tensor {name!r} keeps its data outside the flatbuffer, which a .pte cannot carry")
        if stored is not None and len(stored) and len(stored) < nbytes:
            raise _bad(where, f"tensor {name!r} {shape} of {dtype} needs {nbytes} bytes of data, has {len(stored)}")
    names |= {s.get("name") or "" for s in block.get("shapes") or []}
    for k, op in enumerate(block.get("operators") or []):
        for operand in (op.get("inputs") or []) + (op.get("outputs") or []):
            if operand not in names:
                raise _bad(where, f"operator {k} ({op.get('op')}) uses {operand!r}, which the block does not define")
    for kind in ("inputs", "outputs"):
        for name in block.get(kind) or []:
            if name not in names:
                raise _bad(where, f"block {kind[:-1]} {name!r} is not one of its tensors")
    return total
