"""Compiles several tests need, made once per test run: what one test compiled, kept in a folder all test workers
of the run share, for a later test that needs only that (the first to need it makes it)."""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path
from typing import Callable

from support.npu import ethosu_blobs


def run_folder(tmp_path_factory) -> Path:
    """The folder of this test run that every test worker shares."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def made_once(folder: Path, make: Callable[[Path], None]) -> Path:
    """``folder``, filled by ``make(folder)`` once per test run: by the first test worker to need it, the others
    waiting on its lock, then reading it."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".done").exists():
            make(folder)
            (folder / ".done").touch()
    return folder


class SharedFiles:
    """name -> the file ``make(name, path)`` writes at ``path``, made once per test run when a test first needs it
    (so a test pays only for the files it reads, and no worker makes one another made)."""

    def __init__(self, folder: Path, suffix: str, make: Callable[[str, Path], None]):
        self.folder, self.suffix, self.make = folder, suffix, make

    def __getitem__(self, name: str) -> Path:
        made_once(self.folder / name, lambda folder: self.make(name, folder / f"{name}{self.suffix}"))
        return self.folder / name / f"{name}{self.suffix}"


def case_key(table, name: str, target: str) -> str:
    """The key of an op-table case compiled (int8 or the table's config) for ``target``."""
    return f"{table.name}.{name}.{target}"


class Streams:
    """Each Ethos-U delegate's (TOSA, payload) of a compile, by key (the case, the target): written whole or not at
    all (a folder renamed into place), so a worker reads a compile another finished or none."""

    def __init__(self, folder: Path):
        self.folder = folder

    def put(self, key: str, compiled) -> None:
        """Keep ``compiled``'s Ethos-U delegates under ``key``."""
        if (self.folder / key).exists():
            return
        made = Path(tempfile.mkdtemp(dir=self.folder, prefix=".streams-"))
        for k, (tosa, payload) in enumerate(ethosu_blobs(compiled)):
            (made / f"{k}.tosa").write_bytes(tosa)
            (made / f"{k}.payload").write_bytes(payload)
        try:
            made.rename(self.folder / key)
        except OSError:  # another worker put the same compile first
            pass

    def get(self, key: str) -> list[tuple[bytes, object]] | None:
        """The (TOSA, parsed payload) of each delegate kept under ``key``, or None."""
        from tosakit.backends.ethosu.payload import parse_payload

        folder = self.folder / key
        if not folder.exists():
            return None
        count = len(list(folder.glob("*.tosa")))
        return [((folder / f"{k}.tosa").read_bytes(), parse_payload((folder / f"{k}.payload").read_bytes()))
                for k in range(count)]
