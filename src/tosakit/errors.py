"""User-facing errors: every failure names the thing at fault and what to do."""

from __future__ import annotations

import contextlib
import copy
import os
import tempfile
from pathlib import Path

# Hints that several places give, one text each
RAISE_MEMORY_HINT = "raise the limit (tosakit run --max-memory) if you trust the file"
CORRUPT_STREAM_HINT = "the command stream is corrupt: recompile the program"
RUN_TOSA_HINT = "run the program's TOSA instead (tosakit run --engine tosa)"
REPORT_GRAPH_HINT = "please report this graph to tosakit"
DAMAGED_WEIGHTS_HINT = "the weight stream is damaged or was not written by Vela: compile the model again"


class TosakitError(Exception):
    """An error the user can fix: ``message`` names the culprit, ``hint`` the fix."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  fix: {self.hint}"

    def prefixed(self, where: str) -> "TosakitError":
        """The same error (its kind and fields kept) with ``where`` before its message."""
        new = copy.copy(self)
        new.message = f"{where}: {self.message}"
        new.args = (new.message,)
        return new


class UnsupportedOpError(TosakitError):
    """An operator no backend can run on a target that needs it."""


class IndexRangeError(TosakitError):
    """An index the program reads (a token id a gather takes) lies outside 0..``high``: ``value``."""

    def __init__(self, message: str, hint: str, value: int, high: int):
        super().__init__(message, hint)
        self.value, self.high = value, high


def first_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's first non-empty line, cut to ``limit`` characters: torch's messages can go on to
    print whole tensors or generated code."""
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    return (lines[0] if lines else type(exc).__name__)[:limit]


def did_you_mean(name: str, choices) -> str:
    """A short 'choose one of' text, nearest matches first."""
    import difflib

    choices = list(choices)
    close = difflib.get_close_matches(name, choices, n=3, cutoff=0.5)
    listed = ", ".join(choices)
    if close:
        return f"did you mean {' or '.join(repr(c) for c in close)}? Valid: {listed}"
    return f"valid choices: {listed}"


def check_writable(path: str | os.PathLike, option: str, source: str | os.PathLike | None = None) -> None:
    """Refuse, before any work, an output ``path`` that is not a regular file, names the input ``source``, or lies
    in a folder that is missing or read-only."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    fix = f"give {option} a file path in a folder you can write"
    if path.exists() and not path.is_file():
        raise TosakitError(f"{option} {path} is not a regular file", fix)
    if source is not None and path.exists() and path.resolve() == Path(source).resolve():
        raise TosakitError(f"{option} {path} is the input file itself", fix)
    if not parent.is_dir():
        raise TosakitError(f"{option} {path}: folder {parent} does not exist", fix)
    if not os.access(parent, os.W_OK):
        raise TosakitError(f"{option} {path}: folder {parent} is not writable", fix)
    if len(path.name.encode()) > 255 - 16:  # write_atomic's temporary name adds a prefix and a suffix
        raise TosakitError(f"{option} {path}: the file name is too long", fix)


def write_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to a temporary file beside ``path``, then rename: never a half file."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise TosakitError(
            f"cannot write {path}: folder {parent} does not exist",
            "create the folder or choose another output path",
        )
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; give it normal file permissions
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path
