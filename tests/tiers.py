"""The two tiers: `python -m pytest -m "not slow"` runs in this process only; a test that starts
Python processes (`python -m fsdp_lab`, torchrun, spawned ranks or sweep jobs) is marked `slow`.
The guard below holds every unmarked test to that while it sets up and runs, so the fast tier stays
fast as tests are added."""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
import sys
from contextlib import contextmanager
from unittest import mock

MARKER = "slow"


def _is_python(args, executable) -> bool:
    program = executable or (args if isinstance(args, (str, bytes, os.PathLike)) else args[0])
    first = os.fsdecode(program).split()[0]
    return first == sys.executable or os.path.basename(first).startswith("python")


@contextmanager
def in_process_only(test_id: str):
    """Refuse Python processes started by `test_id` (the fast tier's promise), naming the marker."""
    def refuse(what: str):
        raise AssertionError(f"{test_id} starts {what}: mark the test @pytest.mark.{MARKER} (tests/tiers.py)")

    execute_child = subprocess.Popen._execute_child

    def execute_non_python(self, args, executable, *rest, **kwargs):
        if _is_python(args, executable):
            refuse(f"a Python process ({args if isinstance(args, str) else ' '.join(map(str, args))})")
        return execute_child(self, args, executable, *rest, **kwargs)

    def start(self):
        refuse(f"a multiprocessing process ({self.name})")

    # Under plan.workers=0 a plan starts its tracing pool where a timed trace says the pool would finish
    # first (fsdp_lab/plan/side_by_side.py). A tiny model's traces take milliseconds, but on a machine busy
    # with the other tests one can take long enough to start a pool: here the plan sees one CPU and traces
    # in this process. Not by patching pool_gains, which tests/shared_traces.py patches in module fixtures:
    # one set up inside this guard (for its module's first test) would restore this patch at its teardown.
    with mock.patch.object(subprocess.Popen, "_execute_child", execute_non_python), \
            mock.patch.object(multiprocessing.process.BaseProcess, "start", start), \
            mock.patch("fsdp_lab.plan.side_by_side.usable_cpus", return_value=1):
        yield
