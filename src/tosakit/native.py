"""Calling native code quietly: what C++ libraries print goes to a string, not the terminal."""

from __future__ import annotations

import contextlib
import ctypes
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
        try:
            yield text
        finally:
            _flush_c_stdio()
            for fd, old in zip(fds, saved):
                os.dup2(old, fd)  # the last write end closes: the reader sees EOF
                os.close(old)
            reader.join()
            os.close(read_end)
            text.append(b"".join(chunks).decode("utf-8", errors="replace"))
