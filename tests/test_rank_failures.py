"""A failed rank is reported by its own error, `Type: message`, never by torch elastic's boilerplate:
real ranks started through torch elastic (the launcher the lab spawns its runs with), each failing
its own way. They are forked from a warm process (tests/warm_lab.py), not from the test process: by
now it holds threads of earlier in-process runs (W&B's exporters), and a child forked from a
threaded process can abort before it reports."""

from __future__ import annotations

import os
import pickle
import signal
from pathlib import Path

import pytest
from torch.distributed.checkpoint.api import CheckpointException

from fsdp_lab.failure_report import record_failure
from fsdp_lab.spawn import RankFailed, launch
from warm_lab import in_a_warm_process

pytestmark = [pytest.mark.fault, pytest.mark.slow]


@record_failure
def raises_value_error():
    raise ValueError("train.batch_size must be positive")


@record_failure
def raises_multiline():
    raise RuntimeError("the first line says it\nthe second is detail")


@record_failure
def dcp_load_of_a_damaged_file():
    # DCP's CheckpointException is a BaseException that wraps each rank's own error.
    try:
        pickle.loads(b"\xaf")
    except pickle.UnpicklingError as e:
        raise CheckpointException("read", {0: (e, None)}) from e


@record_failure
def exits_with_code_3():
    os._exit(3)


@record_failure
def killed():
    os.kill(os.getpid(), signal.SIGKILL)


def report_of_one_failed_rank(entry, run_dir: str) -> None:
    """In the warm process: `entry` on one rank through torch elastic; prints how its failure is reported."""
    try:
        launch(entry, (), n=1, run_dir=Path(run_dir), max_restarts=0, start_method="fork")
    except RankFailed as e:
        print(f"RankFailed: {e}")


@pytest.mark.parametrize("entry,reported", [
    (raises_value_error, "rank 0 failed: ValueError: train.batch_size must be positive"),
    (raises_multiline, "rank 0 failed: RuntimeError: the first line says it"),
    (dcp_load_of_a_damaged_file, "rank 0 failed: UnpicklingError: invalid load key, '\\xaf'."),
    (exits_with_code_3, "rank 0 failed: exit code 3"),
    (killed, "rank 0 died from signal SIGKILL"),
], ids=lambda v: getattr(v, "__name__", ""))
def test_a_failed_rank_is_reported_by_its_own_error(entry, reported, tmp_path):
    code, stdout, stderr = in_a_warm_process(report_of_one_failed_rank, (entry, str(tmp_path / "run")), timeout=120)
    assert code == 0, stderr[-3000:]
    assert f"RankFailed: {reported}" in stdout.splitlines(), stdout[-2000:]
