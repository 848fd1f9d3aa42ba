"""Shared pytest fixtures and hooks (the helpers behind them live in tests/support/)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from support import REPO
from support.harness import Harness
from support.oracle import EtOracle
from support.programs import ProgramCheck
from support.shared import Streams, run_folder


def _share_the_cores() -> None:
    """Under pytest-xdist each worker computes with its share of the cores, and so do the processes its tests
    start (the CLI, the ExecuTorch oracle): two workers each running two OpenMP threads on two cores make every
    parallel region wait for a descheduled thread (a float64 3x3 convolution on an 8x8 map took 10 ms, not
    0.1 ms). A thread count given in the environment (make test-any-machine's OMP_NUM_THREADS=1, 2, 4) is left as
    it is: the numerics tests hold under any."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers < 2 or "OMP_NUM_THREADS" in os.environ:
        return
    import threadpoolctl
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = max(1, cores // workers)
    os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    threadpoolctl.threadpool_limits(threads)


_share_the_cores()


@pytest.fixture(scope="session")
def et_oracle() -> EtOracle:
    python = Path(os.environ.get("TOSAKIT_ORACLE_PYTHON", REPO / ".venv-oracle" / "bin" / "python"))
    if not python.exists():
        pytest.fail(f"ExecuTorch oracle python {python} not found: run `make oracle` (or `make test`) to create .venv-oracle")
    oracle = EtOracle(python)
    yield oracle
    oracle.close()


@pytest.fixture(scope="session")
def harness() -> Harness:
    return Harness()


@pytest.fixture
def program_check(et_oracle, tmp_path) -> ProgramCheck:
    return ProgramCheck(et_oracle, tmp_path)


@pytest.fixture(scope="session")
def streams(tmp_path_factory) -> Streams:
    """Ethos-U streams one test compiled, for the later tests of the run that need only them."""
    folder = run_folder(tmp_path_factory) / "streams"
    folder.mkdir(exist_ok=True)
    return Streams(folder)


@pytest.fixture(scope="session")
def vgf_stack() -> None:
    """The VGF engine's stack, or a skip saying what is missing: only off CI (CI runs as root, where `make setup`
    installs it, so there a missing stack fails)."""
    from tosakit.runtime.vgf import missing

    gaps = missing()
    if gaps:
        reason = "the VGF engine's stack is missing: " + "; ".join(f"{w} ({h})" for w, h in gaps)
        if os.geteuid() == 0:
            pytest.fail(reason + "; as root, `make setup` installs it")
        pytest.skip(reason)
