"""The default experiment end to end, in real processes on CPU/gloo."""

from __future__ import annotations

import sys

import pytest

from fsdp_lab.memory_phases import PHASES
from fsdp_lab.cli_process import run_lab
from wandb_records import OfflineRun
from warm_lab import run_lab_warm

pytestmark = pytest.mark.slow

METRIC_KEYS = {"step", "loss", "parity/loss_abs_diff", "memory/peak_mib", "perf/step_time_s", "perf/tokens_per_s", "perf/mfu"}


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    result = run_lab("train.steps=6", run_dir=tmp_path_factory.mktemp("default") / "run")
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_default_run_writes_summary_with_the_public_keys(default_run):
    s = default_run.summary
    assert s["status"] == "ok" and s["error"] is None
    assert (s["steps"], s["world_size"], s["device"]) == (6, 2, "cpu")
    assert s["mesh"] == {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "tp": 1, "engine": "fsdp2"}
    assert s["parity"]["ok"] and s["parity"]["max_loss_abs_diff"] <= 1e-5 and s["parity"]["max_param_abs_diff"] <= 1e-5
    assert set(s["memory"]["phases_mib"]) == set(PHASES)
    assert s["perf"]["tokens_per_s"] > 0
    assert s["final_loss"] == pytest.approx(default_run.metrics[-1]["loss"])
    assert (default_run.run_dir / ".hydra" / "config.yaml").exists()


def test_metrics_has_one_row_per_step_with_every_metric(default_run):
    rows = default_run.metrics
    assert [r["step"] for r in rows] == list(range(1, 7))
    for row in rows:
        assert METRIC_KEYS | {f"memory/{p}_mib" for p in PHASES} <= set(row)
    assert "parity/param_max_abs_diff" in rows[4] and "parity/param_max_abs_diff" in rows[5]


def test_memory_phases_follow_the_physics_of_a_step(default_run):
    rows = default_run.metrics
    for row in rows:
        m = {p: row[f"memory/{p}_mib"] for p in PHASES}
        assert m["after_fwd"] > m["start"], "forward keeps activations"
        assert m["after_bwd"] < m["after_loss"], "backward frees the activations"
        assert m["done"] < m["after_step"], "zero_grad frees the gradients"
        assert row["memory/peak_mib"] >= max(m.values())
    first, second = rows[0], rows[1]
    assert first["memory/after_step_mib"] > first["memory/after_bwd_mib"], "the first step creates optimizer state"
    assert second["memory/start_mib"] > first["memory/start_mib"], "optimizer state persists into the next step"


def test_wandb_offline_run_holds_the_metrics_and_summary(default_run):
    run = OfflineRun.in_run_dir(default_run.run_dir)
    losses = [row["loss"] for row in run.history if "loss" in row]
    assert losses == pytest.approx([r["loss"] for r in default_run.metrics])
    assert {"parity/loss_abs_diff", "memory/peak_mib", "perf/tokens_per_s"} <= set(run.history[-1])
    assert run.summary["status"] == "ok"
    assert run.config["train"]["steps"] == 6


def test_process_prints_run_dir_and_progress(default_run):
    assert "step 6/6 | loss" in default_run.stdout
    assert default_run.stdout.rstrip().endswith(f"run dir: {default_run.run_dir}")


def test_external_torchrun_gives_one_run_dir(tmp_path):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "fsdp_lab"]
    result = run_lab("train.steps=2", "logger=none", "hydra.run.dir=" + str(tmp_path / "tr" / "${fsdp_lab_run_id:}"), command=torchrun)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dirs = list((tmp_path / "tr").rglob("summary.json"))
    assert len(run_dirs) == 1, f"all ranks must share one run dir, found {run_dirs}"
    assert result.summary["status"] == "ok" and result.summary["world_size"] == 2
    assert result.stdout.count("run dir: ") == 1


def test_mlp_stack_without_reshard_matches_ddp(tmp_path):
    result = run_lab_warm("+experiment=mlp_stack_no_reshard", "logger=none", run_dir=tmp_path / "run")  # what it trained, not its process
    assert result.returncode == 0, result.stderr[-3000:]
    s = result.summary
    assert s["parity"]["ok"] and s["parity"]["max_param_abs_diff"] <= 1e-5 and s["steps"] == 10
