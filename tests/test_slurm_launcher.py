"""A real sweep through `hydra/launcher=slurm` on a one-node SLURM cluster started on this machine
(scripts/slurm_local.sh: root, Debian packages slurm-wlm and munge, installed if missing)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from lab import REPO, run_lab

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
