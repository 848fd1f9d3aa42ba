"""Vela's weight codec (``ethosu.mlw_codec``, native code) in a process of its own. On some damaged streams it
prints an error and ends its process with exit(), so the simulator never calls it in its own: one codec process
per simulating process, started on first use, restarted after a stream ends it, bounded in memory and time.

Protocol on the pipes: a request is an 8-byte little-endian length and the stream's bytes; the answer an 8-byte
signed count, then that many int16 weights, or (a negative count) -count bytes of the codec's error message.

``ahead`` decodes the streams a run will need on a thread while the run computes (the codec process works on
another core): a program's first run waits only for streams not decoded yet."""

from __future__ import annotations

import array
import os
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager

import numpy as np

from ...errors import DAMAGED_WEIGHTS_HINT, TosakitError
from ...native import cap_address_space, read_exact

CODEC_MEMORY = 1 << 30  # address space the codec process may add to what its imports mapped
CODEC_SECONDS = 60.0  # longest one stream may take when the caller gives no deadline
AHEAD_BYTES = 256 << 20  # decoded weights held for a run before it asks for them


class CodecProcess:
    """The codec process of this process (``decode`` starts it on first use)."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.log = None
        self.lock = threading.Lock()  # one request on the pipes at a time
        self.planned: _Ahead | None = None

    def _start(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            self.log = tempfile.TemporaryFile()  # a file, not a pipe: the codec's messages can never block it
            env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
            self.proc = subprocess.Popen([sys.executable, "-m", "tosakit.runtime.ethosu.codec", str(CODEC_MEMORY)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env)
        return self.proc

    def decode(self, data: bytes, deadline: float | None = None) -> np.ndarray:
        """The weights (int16) of one compressed stream."""
        planned = self.planned
        found = planned.take(data) if planned is not None else None
        if isinstance(found, TosakitError):
            raise found
        if found is not None:
            return found
        with self.lock:
            return self._decode(data, deadline)

    @contextmanager
    def ahead(self, streams: list[bytes], deadline: float | None = None):
        """Within the block, ``streams`` are decoded in order on a thread; ``decode`` of one of them waits for
        its answer (or error) instead of asking the codec itself."""
        planned = _Ahead(self, streams, deadline)
        self.planned = planned
        try:
            yield
        finally:
            self.planned = None
            planned.finish()

    def _decode(self, data: bytes, deadline: float | None) -> np.ndarray:
        proc = self._start()
        end = deadline if deadline is not None else time.monotonic() + CODEC_SECONDS
        try:
            proc.stdin.write(len(data).to_bytes(8, "little") + data)
            proc.stdin.flush()
            count = int.from_bytes(read_exact(proc.stdout.fileno(), 8, end), "little", signed=True)
            if count < 0:
                raise TosakitError(f"the weight stream ({len(data)} bytes) does not decode: "
                                   f"{read_exact(proc.stdout.fileno(), -count, end).decode(errors='replace')}", DAMAGED_WEIGHTS_HINT)
            return np.frombuffer(read_exact(proc.stdout.fileno(), 2 * count, end), "<i2").astype(np.int16)
        except (BrokenPipeError, EOFError):
            proc.wait()
            raise TosakitError(f"Vela's weight codec stopped on the weight stream ({len(data)} bytes): "
                               f"{self._last_message() or f'exit status {proc.returncode}'}", DAMAGED_WEIGHTS_HINT) from None
        except TimeoutError:
            self.close()
            raise TosakitError(f"Vela's weight codec ran past the time limit on the weight stream ({len(data)} bytes)",
                               "raise the time limit (--timeout SECONDS), or the stream is damaged") from None

    def _last_message(self) -> str:
        self.log.seek(0)
        lines = [ln.strip() for ln in self.log.read()[-4096:].decode(errors="replace").splitlines() if ln.strip()]
        return " ".join(lines[-1].split())[:200] if lines else ""

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


class _Ahead:
    """A thread decoding a run's streams before the run asks for them, keeping the answers (or errors)."""

    def __init__(self, codec: CodecProcess, streams: list[bytes], deadline: float | None):
        self.codec, self.streams, self.deadline = codec, list(dict.fromkeys(streams)), deadline
        self.pending = set(self.streams)
        self.answers: dict[bytes, np.ndarray | TosakitError] = {}
        self.ready = threading.Condition()
        self.stop = False
        self.thread = threading.Thread(target=self._work, name="tosakit-codec-ahead", daemon=True)
        self.thread.start()

    def _work(self) -> None:
        held = 0
        for data in self.streams:
            if self.stop or held > AHEAD_BYTES or (self.deadline is not None and time.monotonic() > self.deadline):
                break
            with self.codec.lock:
                try:
                    answer = self.codec._decode(data, self.deadline)
                    held += answer.nbytes
                except TosakitError as exc:
                    answer = exc
            with self.ready:
                self.answers[data] = answer
                self.pending.discard(data)
                self.ready.notify_all()
        with self.ready:
            self.pending.clear()
            self.ready.notify_all()

    def take(self, data: bytes) -> np.ndarray | TosakitError | None:
        """The answer for ``data`` once the thread has it; None if the thread will not decode it."""
        with self.ready:
            self.ready.wait_for(lambda: data not in self.pending)
            return self.answers.get(data)

    def finish(self) -> None:
        self.stop = True
        self.thread.join()


CODEC = CodecProcess()


def _serve(memory: int) -> None:
    """Answer requests from standard input until it closes."""
    from ethosu import mlw_codec

    cap_address_space(memory)
    source, sink = sys.stdin.buffer, sys.stdout.buffer
    while len(head := source.read(8)) == 8:
        data = source.read(int.from_bytes(head, "little"))
        try:
            values = array.array("h", mlw_codec.decode(bytearray(data)))  # int9 weights
            if sys.byteorder == "big":
                values.byteswap()
            answer = len(values).to_bytes(8, "little", signed=True) + values.tobytes()
        except (Exception, MemoryError) as exc:  # the codec's own refusals, or more memory than allowed
            message = (str(exc) or type(exc).__name__).encode()[:500]
            answer = (-len(message)).to_bytes(8, "little", signed=True) + message
        sink.write(answer)
        sink.flush()


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
