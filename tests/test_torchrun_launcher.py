"""Sweeps through `hydra/launcher=torchrun` (the default for -m): real jobs of 2 gloo ranks each."""

from __future__ import annotations

import json
import re

import pytest

from in_process import run_lab_here
from warm_lab import run_lab_warm


TINY = ["debug=cpu_tiny", "model.n_layers=1", "probes.memory.enabled=false"]


def sweep(sweep_dir, *overrides: str):
    """The sweep's driver forked from the warm server (tests/warm_lab.py): its jobs, output and exit as the CLI's."""
    return run_lab_warm("-m", *overrides, *TINY, f"hydra.sweep.dir={sweep_dir}")


def rows(sweep_dir) -> list[dict]:
    return json.loads((sweep_dir / "sweep_summary.json").read_text())["jobs"]


@pytest.mark.slow
def test_packed_sweep_runs_jobs_side_by_side_and_writes_the_sweep_summary(tmp_path):
    result = sweep(tmp_path, "optim=adamw,sgd", "hydra.launcher.max_ranks=4")
    assert result.returncode == 0, result.stderr[-3000:]
    events = re.findall(r"^\[sweep\] job (\d) (started|ok)", result.stdout, flags=re.M)
    assert events[:2] == [("0", "started"), ("1", "started")], f"both 2-rank jobs fit in 4 ranks: {events}"
    summary = rows(tmp_path)
    assert [r["job"] for r in summary] == [0, 1]
    for row, optim in zip(summary, ["adamw", "sgd"]):
        job_dir = tmp_path / str(row["job"])
        job = json.loads((job_dir / "summary.json").read_text())
        assert row["status"] == job["status"] == "ok" and row["error"] is None
        assert f"optim={optim}" in row["overrides"] and row["run_dir"] == str(job_dir)
        assert row["world_size"] == job["world_size"] == 2 and row["final_loss"] == job["final_loss"]
        assert row["parity_ok"] is True and row["tokens_per_s"] > 0
        assert (job_dir / ".hydra" / "overrides.yaml").exists() and (job_dir / "logs" / "job.out").exists()
        rank_logs = {p.parent.name for p in job_dir.glob("logs/*/attempt_0/*/stderr.log")}
        assert rank_logs == {"0", "1"}, "every rank of every job has its own log"
    assert summary[0]["final_loss"] != summary[1]["final_loss"], "each job ran its own config"
    assert "sweep summary: " in result.stdout and "2 ok, 0 failed" in result.stdout


@pytest.mark.slow
def test_failing_job_does_not_stop_the_others_and_the_sweep_exits_naming_it(tmp_path):
    # Job 0 raises on rank 1 at step 1; job 1 has no fault (one past its last step would be refused), so it runs clean.
    # Packing off: the jobs run one after the other, and the second still runs after the first failed.
    # No restarts: an injected fault fires on the first attempt only, so a restart would recover the job
    # (tests/test_checkpoint.py covers recovery through torch elastic restarts).
    result = sweep(tmp_path, "fault={kill_rank:1,at_step:1,kind:raise},{}",
                   "hydra.launcher.pack=false", "hydra.launcher.max_restarts=0")
    assert result.returncode == 1
    failed, ok = rows(tmp_path)
    assert failed["status"] == "failed" and failed["error"].startswith("rank 1 failed: RuntimeError: injected fault")
    assert ok["status"] == "ok" and ok["steps"] == 2
    assert "launch.max_restarts=0" in failed["overrides"], "hydra.launcher.max_restarts reaches every job"
    attempts = {p.name for p in (tmp_path / "0" / "logs").glob("*/attempt_*")}
    assert attempts == {"attempt_0"}
    assert re.search(r"^error: 1 of 2 sweep jobs failed: job 0 \[fault=\{kill_rank:1,at_step:1,kind:raise\}.*\]: rank 1 failed", result.stderr, flags=re.M)
    events = re.findall(r"^\[sweep\] job (\d) (started|ok|FAILED)", result.stdout, flags=re.M)
    assert events == [("0", "started"), ("0", "FAILED"), ("1", "started"), ("1", "ok")]


def test_a_bad_override_in_one_job_refuses_the_sweep_before_any_job_starts(tmp_path):
    # Refused by the launcher in the CLI's own process before any job starts: worked here.
    result = run_lab_here("-m", "train.microbatches=1,3", *TINY, f"hydra.sweep.dir={tmp_path}", as_rank=False)
    assert result.returncode == 2
    [line] = result.error_lines
    assert line.startswith("error: train.microbatches=3: must divide train.batch_size=4 (job 1: train.microbatches=3 ")
    assert "started" not in result.stdout and not (tmp_path / "0").exists()
