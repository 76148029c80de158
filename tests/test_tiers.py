"""The test harness's own promise (tests/tiers.py): the fast tier's guard leaves nothing behind, also
where a module fixture starts inside it."""

from __future__ import annotations

import subprocess
import sys

import pytest

import fsdp_lab.plan.side_by_side as side_by_side
from shared_traces import traces_shared
from tiers import in_process_only


def test_a_module_fixture_set_up_inside_the_guard_leaves_nothing_patched():
    """A module-scoped fixture is set up inside the guard of its module's first test and torn down
    outside any guard, after the module's last test: the fixture's teardown must not put back what the
    guard had set (a worker's plans then never started a pool: tests/test_plan_side_by_side.py failed so
    in a run of the suite on torch 2.11, 2026-11-29; which tests share a worker, not the torch, decides).
    The guard still holds a fast test to one CPU and to no Python process after."""
    before = side_by_side.pool_gains, side_by_side.usable_cpus
    shared = traces_shared()
    with in_process_only("a fast test"):
        shared.__enter__()
    shared.__exit__(None, None, None)
    assert (side_by_side.pool_gains, side_by_side.usable_cpus) == before
    with in_process_only("a fast test"):
        assert side_by_side.usable_cpus() == 1
        with pytest.raises(AssertionError, match=r"^a fast test starts a Python process .*: mark the test @pytest\.mark\.slow"):
            subprocess.run([sys.executable, "-c", "pass"])
