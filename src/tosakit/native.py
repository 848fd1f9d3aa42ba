"""Calling native code: quietly (what it prints, C++ and Python alike, goes to a string, not the terminal), and
at arm's length (a child process that caps its own address space, read with a deadline)."""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import select
import sys
import tempfile
import threading
import time
from typing import Iterator

_LOCK = threading.RLock()


def _flush_c_stdio() -> None:
    with contextlib.suppress(OSError, AttributeError, TypeError):  # no C runtime to flush
        ctypes.CDLL(None).fflush(None)


@contextlib.contextmanager
def captured_output(fds: tuple[int, ...] = (1,)) -> Iterator[list[str]]:
    """Collect everything written to the given file descriptors; the text lands in the list on exit.

    The descriptors point at a temporary file, not a pipe: native code that prints while holding the GIL
    (regor's verbose listings run to megabytes) would block on a full pipe its reader thread cannot drain."""
    with _LOCK:
        sys.stdout.flush()
        sys.stderr.flush()
        sink = tempfile.TemporaryFile()
        saved = [os.dup(fd) for fd in fds]
        for fd in fds:
            os.dup2(sink.fileno(), fd)
        text: list[str] = []
        python_out = io.StringIO()
        try:
            with contextlib.redirect_stdout(python_out), contextlib.redirect_stderr(python_out):
                yield text
        finally:
            _flush_c_stdio()
            for fd, old in zip(fds, saved):
                os.dup2(old, fd)
                os.close(old)
            sink.seek(0)
            text.append(python_out.getvalue() + sink.read().decode("utf-8", errors="replace"))
            sink.close()


def cap_address_space(extra: int) -> None:
    """Limit this process's address space to what it maps now plus ``extra`` bytes (Linux; elsewhere nothing)."""
    import resource

    if os.path.exists("/proc/self/statm"):
        with open("/proc/self/statm") as f:
            limit = int(f.read().split()[0]) * resource.getpagesize() + extra
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def read_exact(fd: int, n: int, end: float) -> bytes:
    """``n`` bytes from ``fd``; TimeoutError past ``end`` (``time.monotonic()``), EOFError if it closes first."""
    out = bytearray()
    while len(out) < n:
        if not select.select([fd], [], [], max(0.0, end - time.monotonic()))[0]:
            raise TimeoutError
        chunk = os.read(fd, min(n - len(out), 1 << 20))
        if not chunk:
            raise EOFError
        out += chunk
    return bytes(out)
