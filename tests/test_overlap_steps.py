"""train.overlap_steps in process (one gloo rank): each step issued before the previous one's loss is
read, the same rows as steps kept apart, steps kept apart where something must see a step finished
(probes that read it, extra steps, faults, a checkpoint's step), and no row lost to a failing step."""

from __future__ import annotations

import time

import pytest

from fsdp_lab.checkpoint import complete_checkpoints, step_dir_name
from fsdp_lab.worker import build_trainer
from in_process import run_lab_here
from warm_lab import run_lab_warm

STEPS = 5
TINY = ["debug=cpu_tiny", "mesh=single", f"train.steps={STEPS}", "train.microbatches=2", "probes=off", "probes.memory.enabled=true"]


@pytest.fixture
def trainer_of(prepared, world_of_one):
    """`trainer_of(*overrides) -> (trainer, rows, issued)`: the tiny run's trainer, the rows it hands
    on, and for each row how many optimizer steps had been issued when it came."""

    def build(*overrides: str):
        run, dims = prepared(*TINY, *overrides)
        rows, issued = [], []
        trainer = build_trainer(run, dims, world_of_one, on_step=lambda row: (rows.append(row), issued.append(steps_taken[0])))
        steps_taken = [0]
        trainer.optimizer.register_step_post_hook(lambda *_: steps_taken.__setitem__(0, steps_taken[0] + 1))
        return trainer, rows, issued

    return build


def figures(rows: list[dict]) -> list[dict]:
    """What a row says of its step: not its timings, nor its memory (compared apart)."""
    return [{k: v for k, v in row.items() if not k.startswith(("perf/", "memory/"))} for row in rows]


def memory(rows: list[dict]) -> list[float]:
    return [v for row in rows for k, v in row.items() if k.startswith("memory/")]


def test_overlapping_steps_give_the_rows_of_steps_apart_each_read_after_the_next_is_issued(trainer_of):
    apart, apart_rows, apart_issued = trainer_of("train.overlap_steps=false")
    apart.run()
    overlapping, rows, issued = trainer_of("train.overlap_steps=true")
    assert overlapping.overlaps_steps()
    overlapping.run()
    assert figures(rows) == figures(apart_rows), "the same losses, norms and rates per step, in order"
    # The memory of the same phases, but for the step before's loss and norm, held until they are read.
    assert memory(rows) == pytest.approx(memory(apart_rows), abs=1 / 1024) and len(memory(rows)) == 7 * STEPS
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert apart_issued == [1, 2, 3, 4, 5]
    assert issued == [2, 3, 4, 5, 5], "each row after the next step is issued; the last one's at the end"
    assert all(r["perf/step_time_s"] > 0 for r in rows)


@pytest.mark.parametrize("overrides", [
    ("probes.parity.enabled=true",),  # its reference replays the step on the model as the step left it
    ("train.standalone_layer=0", "model=mlp_stack"),  # a second optimizer step after each
    # a fault injected (one that corrupts the last step's gradients: the run goes on, as the test needs)
    ("fault.kind=corrupt_grad", "fault.module=output", "fault.kill_rank=0", f"fault.at_step={STEPS - 1}"),
])
def test_steps_stay_apart_where_something_after_a_step_must_see_it_finished(trainer_of, overrides):
    trainer, rows, issued = trainer_of("train.overlap_steps=true", *overrides)
    assert not trainer.overlaps_steps()
    trainer.run()
    per_step = issued[0]  # optimizer steps per training step: 2 with the standalone layer
    assert issued == [per_step * n for n in range(1, STEPS + 1)], "each row before the next step is issued"


def test_a_failing_step_leaves_the_row_of_the_step_before_it(trainer_of):
    trainer, rows, issued = trainer_of("train.overlap_steps=true")
    loss, calls = trainer.loss, [0]

    def fails_in_the_third_step(logits, targets):
        calls[0] += 1
        if calls[0] == 5:  # 2 microbatches a step
            raise RuntimeError("the user's loss failed")
        return loss(logits, targets)

    trainer.loss = fails_in_the_third_step
    with pytest.raises(RuntimeError, match="the user's loss failed"):
        trainer.run()
    assert [r["step"] for r in rows] == [1, 2], "step 2's row, read after step 3 began, is written"


@pytest.mark.parametrize("overlap", ["false", "true"])
def test_a_slow_step_is_timed_as_its_own(trainer_of, overlap):
    """A step whose loss takes 3 s longer is the slow row, overlapping or not: an overlapped step's
    time runs from its start to the next's, so on a CPU (where nothing runs ahead, a step's work is
    done as it is issued) it is not charged to the step before. (Another step of the steps apart once
    outlasted a 0.5 s delay in the whole suite on 2 busy cores, and once a 1.5 s one.)"""
    trainer, rows, issued = trainer_of(f"train.overlap_steps={overlap}")
    loss, calls = trainer.loss, [0]

    def slow_in_the_third_step(logits, targets):
        calls[0] += 1
        if calls[0] == 5:  # 2 microbatches a step
            time.sleep(3.0)
        return loss(logits, targets)

    trainer.loss = slow_in_the_third_step
    trainer.run()
    times = {r["step"]: r["perf/step_time_s"] for r in rows}
    assert max(times, key=times.get) == 3 and times[3] >= 3.0, times


def test_a_checkpoint_holds_its_own_step_with_steps_overlapping(tmp_path):
    """Resumed from the checkpoint after step 2, the run trains steps 3-5 as the uninterrupted one
    did: the save waited for step 2 and came before step 3 was issued."""
    common = [*TINY, "logger=none", "train.overlap_steps=true", "checkpoint=dcp", "checkpoint.interval=2", "checkpoint.keep=3"]
    whole = run_lab_here(*common, run_dir=tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert [p.name for p in complete_checkpoints(whole.run_dir)] == [step_dir_name(s) for s in (2, 4, 5)]
    resumed = run_lab_here(*common, f"checkpoint.resume={whole.run_dir / 'checkpoints' / step_dir_name(2)}", run_dir=tmp_path / "resumed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [r["loss"] for r in resumed.metrics if r["step"] > 2] == [r["loss"] for r in whole.metrics if r["step"] > 2]


@pytest.mark.slow
def test_two_ranks_overlapping_steps_log_the_rows_of_steps_apart(tmp_path):
    """Real ranks (gloo): every rank decides alike to overlap, each loss's all-reduce meets its
    peers' in turn, and the rows are those of steps apart."""
    common = ["debug=cpu_tiny", "mesh.world_size=2", "train.steps=4", "probes=off", "probes.memory.enabled=true", "logger=none"]
    runs = {flag: run_lab_warm(*common, f"train.overlap_steps={flag}", run_dir=tmp_path / flag) for flag in ("false", "true")}
    for run in runs.values():
        assert run.returncode == 0, run.stderr[-3000:]
    apart, overlapping = (figures(runs[flag].metrics) for flag in ("false", "true"))
    assert overlapping == apart and [r["step"] for r in overlapping] == [1, 2, 3, 4]
