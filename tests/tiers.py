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

import fsdp_lab.plan.side_by_side as side_by_side

MARKER = "slow"


def _is_python(args, executable) -> bool:
    program = executable or (args if isinstance(args, (str, bytes, os.PathLike)) else args[0])
    first = os.fsdecode(program).split()[0]
    return first == sys.executable or os.path.basename(first).startswith("python")


@contextmanager
def in_process_only(test_id: str):
    """Refuse Python processes started by `test_id` (the fast tier's promise), naming the marker."""
    global _guarded
    before, _guarded = _guarded, test_id
    try:
        yield
    finally:
        _guarded = before


def _refuse(what: str):
    raise AssertionError(f"{_guarded} starts {what}: mark the test @pytest.mark.{MARKER} (tests/tiers.py)")


def _install() -> None:
    """The guard's checks, put in place once, when conftest imports this module (before any fixture),
    and left there: in_process_only only turns them on and off. A guard that patched on entry and
    restored on exit would interleave with the module fixtures set up inside it (for their module's
    first test) and torn down outside it (after its last), each restoring what the other had set: a
    fixture of tests/shared_traces.py left the guard's patch in place for the rest of its worker's
    tests, and their plans never started a pool (2026-11-29)."""
    execute_child = subprocess.Popen._execute_child
    start = multiprocessing.process.BaseProcess.start
    usable_cpus = side_by_side.usable_cpus

    def execute_non_python(self, args, executable, *rest, **kwargs):
        if _guarded and _is_python(args, executable):
            _refuse(f"a Python process ({args if isinstance(args, str) else ' '.join(map(str, args))})")
        return execute_child(self, args, executable, *rest, **kwargs)

    def start_outside_the_fast_tier(self):
        if _guarded:
            _refuse(f"a multiprocessing process ({self.name})")
        return start(self)

    def usable_cpus_outside_the_fast_tier() -> int:
        # Under plan.workers=0 a plan starts its tracing pool where a timed trace says the pool would
        # finish first (fsdp_lab/plan/side_by_side.py). A tiny model's traces take milliseconds, but on a
        # machine busy with the other tests one can take long enough: a fast test's plan sees one CPU.
        return 1 if _guarded else usable_cpus()

    subprocess.Popen._execute_child = execute_non_python
    multiprocessing.process.BaseProcess.start = start_outside_the_fast_tier
    side_by_side.usable_cpus = usable_cpus_outside_the_fast_tier


_guarded: str | None = None  # the fast test being run, while in_process_only holds it
_install()
