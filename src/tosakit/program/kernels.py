"""The ExecuTorch CPU kernels a program may call (``kernels.txt``), with their schemas read without torch:
what emission targets, and what the host runtime checks each KernelCall against before anything runs."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import TosakitError

# schema element type -> the EValue kinds (program.fbs KernelTypes) it accepts
VALUE_KINDS = {
    "Tensor": ("Tensor",),
    "int": ("Int",),
    "SymInt": ("Int",),
    "float": ("Double",),
    "bool": ("Bool",),
    "str": ("String",),
    "Scalar": ("Int", "Double", "Bool"),
    "ScalarType": ("Int",),
    "MemoryFormat": ("Int",),
    "Layout": ("Int",),
    "Device": ("Int",),
}
LIST_KINDS = {"Tensor": "TensorList", "Tensor?": "OptionalTensorList", "int": "IntList", "SymInt": "IntList",
              "float": "DoubleList", "bool": "BoolList"}
_TYPE = re.compile(r"^(?P<base>[A-Za-z]+)(?:\((?P<alias>[a-z]!?)\))?(?P<elem_opt>\?)?(?:\[(?P<n>\d*)\])?(?P<opt>\?)?$")


@dataclass(frozen=True)
class KernelArg:
    """One schema argument: its name, element type, and whether it is a list, optional, or written."""

    name: str
    base: str
    is_list: bool
    optional: bool
    elem_optional: bool
    is_out: bool
    kwarg_only: bool

    def kinds(self) -> tuple[str, ...]:
        """The EValue kinds this argument accepts."""
        if self.is_list:
            kind = LIST_KINDS.get(self.base + ("?" if self.elem_optional else ""))
            found = (kind,) if kind else ()
        else:
            found = VALUE_KINDS.get(self.base, ())
        return found + (("Null",) if self.optional else ())


@dataclass(frozen=True)
class KernelSchema:
    """``name.overload(args) -> returns``; a KernelCall passes every argument, then one return value."""

    key: str
    args: tuple[KernelArg, ...]
    returns: str

    @property
    def outs(self) -> tuple[KernelArg, ...]:
        return tuple(a for a in self.args if a.is_out)

    @property
    def return_kinds(self) -> tuple[str, ...]:
        """The return slot: the out tensor, a TensorList of several (or of a list out), or a scalar."""
        if self.returns in ("Scalar", "SymInt", "int", "float", "bool"):
            return VALUE_KINDS["int" if self.returns == "SymInt" else self.returns]
        outs = self.outs
        if len(outs) == 1 and not outs[0].is_list:
            return ("Tensor",)
        return ("TensorList",)


def _split_top(text: str) -> list[str]:
    """Comma-separated parts of ``text`` outside brackets and quotes."""
    parts, depth, quoted, start = [], 0, False, 0
    for i, ch in enumerate(text):
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch in "([":
            depth += 1
        elif not quoted and ch in ")]":
            depth -= 1
        elif not quoted and ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    tail = text[start:].strip()
    return parts + ([tail] if tail else [])


def parse_schema(line: str) -> KernelSchema:
    """A schema line as torch prints it, e.g. ``aten::add.out(Tensor self, ...) -> Tensor(a!)``."""
    head, _, rest = line.partition("(")
    arg_text, _, returns = rest.rpartition(") -> ")
    args, kwarg_only = [], False
    for part in _split_top(arg_text):
        if part == "*":
            kwarg_only = True
            continue
        type_text, name = part.split("=")[0].split()
        m = _TYPE.match(type_text)
        if not m:
            raise TosakitError(f"kernel schema {head}: cannot read argument type {type_text!r}")
        args.append(KernelArg(name, m["base"], m["n"] is not None, bool(m["opt"]) or (m["n"] is None and bool(m["elem_opt"])),
                              m["n"] is not None and bool(m["elem_opt"]), "!" in (m["alias"] or ""), kwarg_only))
    return KernelSchema(head, tuple(args), returns.strip())


KERNEL_FILES = ("kernels.txt", "kernels_cortex_m.txt")  # the portable and quantized libraries; the Cortex-M one


@functools.lru_cache(maxsize=None)
def kernel_schemas() -> dict[str, KernelSchema]:
    """'aten::add.out' -> its schema, for every kernel ExecuTorch's CPU runtime registers."""
    text = "\n".join((Path(__file__).parent / name).read_text() for name in KERNEL_FILES)
    schemas = [parse_schema(ln.strip()) for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    return {s.key: s for s in schemas}


def kernel_key(name: str, overload: str) -> str:
    """The table key of an operator as a program names it (ExecuTorch's: no dot for the default overload)."""
    return f"{name}.{overload}" if overload else name


def runtime_kernels() -> frozenset[str]:
    """'aten::add.out', ...: the kernels the ExecuTorch runtime can resolve."""
    return frozenset(kernel_schemas())
