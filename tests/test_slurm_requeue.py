"""A SLURM job preempted mid-run (USR2, the signal submitit's launcher asks SLURM for), requeued by
submitit, resuming from its checkpoint to the final loss of an uninterrupted run."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from lab import REPO, lab_env, run_lab
from test_slurm_launcher import TINY, local_slurm  # noqa: F401 (the fixture)

pytestmark = pytest.mark.slurm

STEPS = 150
RUN = [f"train.steps={STEPS}", "checkpoint=dcp", "checkpoint.interval=5", "checkpoint.keep=1", *TINY[1:]]


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)
    return found


def test_a_preempted_slurm_job_is_requeued_and_resumes_to_the_uninterrupted_loss(local_slurm, tmp_path):  # noqa: F811
    sweep_dir = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "fsdp_lab", "-m", "hydra/launcher=slurm", *RUN, f"hydra.sweep.dir={sweep_dir}",
           "hydra.launcher.timeout_min=15"]
    sweep = subprocess.Popen(cmd, cwd=REPO, env=lab_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: list((sweep_dir / "0" / "checkpoints").glob("step_*")), 600, "the job's first checkpoint")
        job_id = wait_for(lambda: [p.name for p in (sweep_dir / ".submitit").iterdir() if p.name.isdigit()], 60, "the job id")[0]
        subprocess.run(["scancel", "--signal=USR2", job_id], check=True)
        output = sweep.communicate(timeout=900)[0]
    finally:
        sweep.kill()
    assert sweep.returncode == 0, output[-3000:]
    summary = json.loads((sweep_dir / "0" / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["steps"] == STEPS
    assert summary["checkpoint"]["resumed_from"], "the requeued job resumed from its checkpoint"
    task_log = "\n".join(p.read_text() for p in (sweep_dir / ".submitit").rglob("*_0_log.err"))
    assert "this job is preempted" in task_log and f"Requeued job {job_id}" in task_log
    uninterrupted = run_lab(*RUN, run_dir=tmp_path / "uninterrupted")
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-3000:]
    assert summary["final_loss"] == uninterrupted.summary["final_loss"]
