"""Calling noisy code quietly: what it prints (C++ and Python alike) goes to a string, not the terminal."""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import sys
import threading
from typing import Iterator

_LOCK = threading.RLock()


def _flush_c_stdio() -> None:
    with contextlib.suppress(OSError, AttributeError, TypeError):  # no C runtime to flush
        ctypes.CDLL(None).fflush(None)


@contextlib.contextmanager
def captured_output(fds: tuple[int, ...] = (1,)) -> Iterator[list[str]]:
    """Collect everything written to the given file descriptors; the text lands in the list on exit."""
    with _LOCK:
        sys.stdout.flush()
        sys.stderr.flush()
        read_end, write_end = os.pipe()
        chunks: list[bytes] = []
        reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(read_end, 65536), b"")))
        reader.start()
        saved = [os.dup(fd) for fd in fds]
        for fd in fds:
            os.dup2(write_end, fd)
        os.close(write_end)
        text: list[str] = []
        python_out = io.StringIO()
        try:
            with contextlib.redirect_stdout(python_out), contextlib.redirect_stderr(python_out):
                yield text
        finally:
            _flush_c_stdio()
            for fd, old in zip(fds, saved):
                os.dup2(old, fd)  # the last write end closes: the reader sees EOF
                os.close(old)
            reader.join()
            os.close(read_end)
            text.append(python_out.getvalue() + b"".join(chunks).decode("utf-8", errors="replace"))
