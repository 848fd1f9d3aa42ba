"""Calling noisy code quietly: what it prints (C++ and Python alike) goes to a string, not the terminal."""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import sys
import tempfile
import threading
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
