"""Packages whose public names are imported on first use (PEP 562), so that reading and checking a
.pte — ``tosakit run`` / ``inspect`` on a file from anywhere — never pays for importing torch."""

from __future__ import annotations

import importlib
import sys


def lazy_exports(package: str, names: dict[str, str]):
    """``__getattr__`` and ``__dir__`` for ``package``: ``names`` maps a public name to the submodule
    (relative, e.g. ``".manager"``) defining it; any other attribute may be a submodule."""

    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if name in names:
            value = getattr(importlib.import_module(names[name], package), name)
        else:
            try:
                value = importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{package}.{name}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(names) | set(vars(sys.modules[package])))

    return __getattr__, __dir__
