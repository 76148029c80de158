"""A real sweep through `hydra/launcher=slurm` on a one-node SLURM cluster started on this machine
(scripts/slurm_local.sh: root, Debian packages slurm-wlm and munge, installed if missing), and a job
preempted mid-run (USR2, the signal submitit asks SLURM for), requeued by submitit, resuming from its
checkpoint to the final loss of an uninterrupted run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from fsdp_lab.cli_process import REPO, lab_env, run_lab
from warm_lab import run_lab_warm

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TINY = ["train.steps=2", "logger=none", "probes.memory.enabled=false", "model.n_layers=1", "model.ffn_dim=32"]


@pytest.fixture(scope="module")
def local_slurm():
    if os.geteuid() != 0:
        pytest.skip("the local SLURM cluster needs root (scripts/slurm_local.sh start)")
    proc = subprocess.run([str(REPO / "scripts" / "slurm_local.sh"), "start"], capture_output=True, text=True, timeout=600)
    if proc.returncode == 4:
        pytest.skip(f"slurm-wlm and munge cannot be installed here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr


def test_slurm_sweep_runs_each_job_as_two_tasks_into_one_run_dir(local_slurm, tmp_path):
    result = run_lab("-m", "hydra/launcher=slurm", "model.dim=16,32", *TINY, f"hydra.sweep.dir={tmp_path}",
                     "hydra.launcher.timeout_min=15", timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads((tmp_path / "sweep_summary.json").read_text())["jobs"]
    assert [(r["job"], r["status"]) for r in rows] == [(0, "ok"), (1, "ok")]
    for row, dim in zip(rows, (16, 32)):
        job_dir = tmp_path / str(row["job"])
        summary = json.loads((job_dir / "summary.json").read_text())
        assert summary["status"] == "ok" and summary["steps"] == 2 and summary["world_size"] == 2
        assert summary["mesh"]["dp_shard"] == 2 and summary["parity"]["ok"]
        assert row["final_loss"] == summary["final_loss"] and f"model.dim={dim}" in row["overrides"]
        assert len(list(tmp_path.rglob(f"{row['job']}/.hydra"))) == 1
    task_logs = sorted(p.name for p in (tmp_path / ".submitit").rglob("*_log.out"))
    assert len(task_logs) == 4 and {name.split("_")[-2] for name in task_logs} == {"0", "1"}, task_logs
    assert {r["run_dir"] for r in rows} == {str(tmp_path / "0"), str(tmp_path / "1")}, "no task resolved a run dir of its own"


STEPS = 150
RUN = [f"train.steps={STEPS}", "checkpoint=dcp", "checkpoint.interval=5", "checkpoint.keep=1", *TINY[1:]]


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)
    return found


def test_a_preempted_slurm_job_is_requeued_and_resumes_to_the_uninterrupted_loss(local_slurm, tmp_path):
    sweep_dir = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "fsdp_lab", "-m", "hydra/launcher=slurm", *RUN, f"hydra.sweep.dir={sweep_dir}",
           "hydra.launcher.timeout_min=15"]
    sweep = subprocess.Popen(cmd, cwd=REPO, env=lab_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: list((sweep_dir / "0" / "checkpoints").glob("step_*")), 600, "the job's first checkpoint")
        job_id = wait_for(lambda: [p.name for p in (sweep_dir / ".submitit").iterdir() if p.name.isdigit()], 60, "the job id")[0]
        subprocess.run(["scancel", "--signal=USR2", job_id], check=True)
        # SLURM holds a requeued job back for a while (BeginTime); let it start again now.
        squeue = ["squeue", "-h", "-j", job_id, "-o", "%T"]
        wait_for(lambda: subprocess.run(squeue, capture_output=True, text=True).stdout.strip() == "PENDING", 120, "the requeue")
        subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=True)
        output = sweep.communicate(timeout=900)[0]
    finally:
        sweep.kill()
    assert sweep.returncode == 0, output[-3000:]
    summary = json.loads((sweep_dir / "0" / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["steps"] == STEPS
    assert summary["checkpoint"]["resumed_from"], "the requeued job resumed from its checkpoint"
    task_log = "\n".join(p.read_text() for p in (sweep_dir / ".submitit").rglob("*_0_log.err"))
    assert "this job is preempted" in task_log and f"JOB {job_id} ON" in task_log and "DUE TO JOB REQUEUE" in task_log
    uninterrupted = run_lab_warm(*RUN, run_dir=tmp_path / "uninterrupted")  # its loss is what counts, not its process
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-3000:]
    assert summary["final_loss"] == uninterrupted.summary["final_loss"]
