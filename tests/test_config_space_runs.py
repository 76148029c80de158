"""The slow tier of the generative test of the configuration space (tests/test_config_space.py):
every accepted estimate and plan runs in process, and a sample of the accepted training
configurations trains for real, in processes forked from the warm server (tests/warm_lab.py): on one
rank and on 2 spawned CPU ranks, each with a time limit (a run that hangs fails its example, with its
output, rather than the suite). An accepted run must exit 0, its summary `ok`,
with a metrics row for every step: no traceback, no silent no-op."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, note, seed, settings

from config_space import SEED, command_line, overrides
from config_space_check import accepted_or_refused, estimate_runs, plan_runs
from config_space_found import FOUND_TRAINING, with_found
from shared_traces import traces_shared
from warm_lab import run_lab_warm

pytestmark = pytest.mark.slow

SLOW = dict(deadline=None, database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much,
                                   HealthCheck.data_too_large])
# A real run is kept to a couple of steps and what a CPU trains in seconds; faults are left to
# tests/test_faults.py (one that fires would end this process's world), compile to its own tests.
REAL = ["train.steps=2", "probes.profile.enabled=false", "model.compile=false", "fault.kill_rank=null", "fault.at_step=null",
        "fault.kind=kill", "fault.phase=step", "fault.module=null", "probes.memory.tracker_step=2", "train.seq_len=8"]


def real(args: list[str], *world: str) -> list[str]:
    """`args` with what a real run here must keep (REAL, and the world's size) in place of what the example drew."""
    kept = REAL + list(world)
    keys = {arg.split("=")[0] for arg in kept}
    return [a for a in args if a.split("=")[0] not in keys] + kept


@pytest.fixture(scope="module")
def one_trace_per_run():
    """The plans of the examples trace each (run, depth, batch, AC mode) once (tests/shared_traces.py):
    hypothesis's examples often differ only in plan.*, which a trace never reads (a fifth of the plans'
    traces were repeats); each plan still ranks its own candidates, estimates them and writes plan.json."""
    with traces_shared():
        yield


@with_found
@seed(SEED)
@settings(max_examples=40, **SLOW)
@given(args=overrides(modes=("estimate", "plan")))
def test_every_accepted_estimate_and_plan_runs(not_a_rank, one_trace_per_run, args):
    note(command_line(args))
    checked = accepted_or_refused(args)
    assume(checked is not None)
    run, dims = checked
    if run.mode == "estimate":
        estimate_runs(args, run, dims)
    else:
        plan_runs(args, run)


def assert_trained(args: list[str], result, run_dir: Path, steps: int) -> None:
    where = f"{command_line(args)}\n  exit {result.returncode}\n{(result.stdout + result.stderr)[-3000:]}"
    assert result.returncode == 0 and "Traceback" not in result.stderr, where
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["steps"] == steps, where
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == steps, where


def trains_when_accepted(args: list[str], world_size: int, timeout: float) -> None:
    """An accepted config trains on `world_size` ranks, in a process forked from the warm server."""
    args = real(args, f"mesh.world_size={world_size}")
    note(command_line(args))
    checked = accepted_or_refused(args)
    assume(checked is not None)
    with tempfile.TemporaryDirectory() as tmp:
        result = run_lab_warm(*args, run_dir=Path(tmp) / "run", timeout=timeout)
        assert_trained(args, result, Path(tmp) / "run", checked[0].train.steps)


@seed(SEED)
@settings(max_examples=30, **SLOW)
@given(args=overrides(modes=("train",), families=("mlp", "mlp_stack", "transformer", "convnet", "unused_input", "custom", "hf")))
def test_accepted_training_runs_on_one_rank(not_a_rank, args):
    trains_when_accepted(args, 1, timeout=120)


@functools.partial(with_found, found=FOUND_TRAINING)
@seed(SEED)
@settings(max_examples=22, **SLOW)
@given(args=overrides(modes=("train",), families=("mlp", "mlp_stack", "transformer", "custom", "hf")))
def test_accepted_training_runs_on_two_spawned_ranks(not_a_rank, args):
    trains_when_accepted(args, 2, timeout=240)
