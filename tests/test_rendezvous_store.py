"""Which rendezvous store a run's ranks meet on (fsdp_lab/spawn.py): each attempt a fresh one, never
the agent's shared store, whether the run can restart or not; and the launch leaves the launching
process's environment as it was. Real ranks through torch elastic, forked from a warm process as
tests/test_rank_failures.py's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fsdp_lab.spawn import launch
from warm_lab import in_a_warm_process

pytestmark = pytest.mark.slow

KEY = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def writes_what_the_rank_sees(out: str) -> None:
    Path(out).write_text(os.environ.get(KEY, "shared"))


def launch_and_report(run_dir: str, max_restarts: int) -> None:
    """In the warm process: one rank through torch elastic; prints what this process's environment
    holds afterwards."""
    launch(writes_what_the_rank_sees, (str(Path(run_dir) / "seen"),), n=1, run_dir=Path(run_dir),
           max_restarts=max_restarts, start_method="fork")
    print(f"after: {os.environ.get(KEY, 'unset')}")


@pytest.mark.parametrize("max_restarts", [0, 2])
def test_each_attempt_meets_on_a_fresh_store_and_the_environment_is_left_as_it_was(max_restarts, tmp_path):
    run_dir = tmp_path / "run"
    code, stdout, stderr = in_a_warm_process(launch_and_report, (str(run_dir), max_restarts), timeout=120)
    assert code == 0, stderr[-3000:]
    assert (run_dir / "seen").read_text() == "1"
    assert "after: unset" in stdout.splitlines(), "the launch leaves the launching process's environment as it was"
