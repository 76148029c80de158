"""W&B as a dashboard user sees it, read back from the offline run files of a real 2-job sweep
(Hydra's basic launcher, each job spawning 2 ranks), and runs where W&B cannot work."""

from __future__ import annotations

import json

import pytest

from fsdp_lab.memory_phases import PHASES
from in_process import run_lab_here
from fsdp_lab.cli_process import lab_env, run_lab
from wandb_records import OfflineRun

SECRET = "tok-3f9a1c77e2b04d5e-do-not-log"
API_KEY = "fake0123456789abcdef0123456789abcdef0123"  # 40 characters, like a real W&B key
JOBS = {"0": "adamw", "1": "sgd"}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    sweep_dir = tmp_path_factory.mktemp("w") / "sweeps" / "mesh_study" / "run1"
    result = run_lab(
        "-m", "mesh.dp_shard=-1", "train.steps=2", "optim=adamw,sgd", "logger.mode=offline",
        "probes.profile.enabled=true", "probes.profile.first_step=2", "probes.profile.steps=1",
        # A secret that reaches the resolved config must still stay out of W&B.
        "logger.tags=[lab,${oc.env:MY_SERVICE_TOKEN}]", f"hydra.sweep.dir={sweep_dir}",
        env=lab_env(MY_SERVICE_TOKEN=SECRET, WANDB_API_KEY=API_KEY), timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    runs = {num: OfflineRun.in_run_dir(sweep_dir / num) for num in JOBS}
    return sweep_dir, runs


@pytest.mark.slow
def test_sweep_jobs_share_a_group_and_are_named_by_their_overrides(sweep):
    _, runs = sweep
    for num, optim in JOBS.items():
        run = runs[num].run
        assert run.run_group == "mesh_study/run1", "the sweep dir below sweeps/"
        assert run.display_name == f"optim={optim}", "only the swept key, not the overrides every job shares"
        assert run.job_type == "fsdp2-dp_shard2"
        assert runs[num].config["optim"]["name"] == optim
        assert runs[num].config["logger"]["group"] == "mesh_study/run1"


@pytest.mark.slow
def test_every_metric_is_plotted_against_step_with_its_reduction(sweep):
    sweep_dir, runs = sweep
    defs = runs["0"].metric_definitions
    assert not defs["step"].step_metric and defs["*"].step_metric == "step"
    reductions = {
        "loss": {"last", "min"}, "parity/loss_abs_diff": {"min", "max"}, "parity/param_max_abs_diff": {"min", "max"},
        "memory/peak_mib": {"max"}, **{f"memory/{p}_mib": {"max"} for p in PHASES},
        "perf/step_time_s": {"mean"}, "perf/tokens_per_s": {"mean"}, "perf/mfu": {"mean"},
    }
    for key, expected in reductions.items():
        assert defs[key].step_metric == "step", key
        assert {f.name for f, on in defs[key].summary.ListFields() if on} == expected, key

    rows = [json.loads(line) for line in (sweep_dir / "0" / "metrics.jsonl").read_text().splitlines()]
    history = runs["0"].history
    assert [r["step"] for r in history] == [1, 2], "one W&B history row per metrics.jsonl row"
    logged = {k for k, v in rows[-1].items() if v is not None}  # perf/mfu is null on CPU
    assert logged <= set(history[-1]), "every key of metrics.jsonl is in W&B under the same name"
    summary = runs["0"].summary
    assert summary["loss"]["last"] == pytest.approx(rows[-1]["loss"])
    assert summary["memory/peak_mib"]["max"] == pytest.approx(max(r["memory/peak_mib"] for r in rows))
    for phase in PHASES:
        assert summary[f"memory/{phase}_mib"]["max"] == pytest.approx(max(r[f"memory/{phase}_mib"] for r in rows))
    assert summary["parity/loss_abs_diff"]["max"] == pytest.approx(max(r["parity/loss_abs_diff"] for r in rows))


@pytest.mark.slow
def test_final_summary_and_tables_match_summary_json(sweep):
    sweep_dir, runs = sweep
    for num in JOBS:
        written = json.loads((sweep_dir / num / "summary.json").read_text())
        summary = runs[num].summary
        assert summary["status"] == "ok" and summary["steps"] == 2
        assert summary["parity"] == written["parity"] and summary["memory"] == written["memory"]
        assert summary["final_loss"] == pytest.approx(written["final_loss"])

        files = next((sweep_dir / num).glob("wandb/offline-run-*/files"))
        assert summary["tables/parity_verdict"]["_type"] == summary["tables/memory_phases"]["_type"] == "table-file"
        parity = json.loads((files / summary["tables/parity_verdict"]["path"]).read_text())
        p = written["parity"]
        assert parity["data"] == [[p["reference"], p["tolerance"], p["max_loss_abs_diff"], p["max_param_abs_diff"], p["ok"]]]
        memory = json.loads((files / summary["tables/memory_phases"]["path"]).read_text())
        expected = [[ph, written["memory"]["phases_mib"][ph]] for ph in PHASES] + [["peak", written["memory"]["peak_mib"]]]
        assert memory["data"] == expected
        ops = json.loads((files / summary["tables/profile_ops"]["path"]).read_text())
        assert ops["columns"] == ["name", "self_ms_per_step", "total_ms_per_step", "calls_per_step"]
        assert ops["data"] == [[op[c] for c in ops["columns"]] for op in written["profile"]["top_ops"]]


@pytest.mark.slow
def test_no_secret_from_the_environment_in_any_file(sweep):
    sweep_dir, runs = sweep
    assert runs["0"].config["logger"]["tags"] == ["lab", "***"]
    assert list(runs["0"].run.tags) == ["lab", "***"]
    files = [p for p in sweep_dir.rglob("*") if p.is_file()]
    assert any(p.suffix == ".wandb" for p in files) and len(files) > 20
    for path in files:
        data = path.read_bytes()
        assert SECRET.encode() not in data and API_KEY.encode() not in data, f"secret written to {path}"


def _assert_run_finished_without_wandb(result, steps: int) -> None:
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.summary["status"] == "ok"
    assert [r["step"] for r in result.metrics] == list(range(1, steps + 1)), "metrics.jsonl holds every step"
    # Spawned ranks log to stderr; a process that is the rank itself logs through Hydra's job logging (stdout).
    assert (result.stdout + result.stderr).count("W&B disabled for this run") == 1, result.stderr[-3000:]


@pytest.mark.slow
def test_unreachable_wandb_server_leaves_the_run_ok(tmp_path):
    result = run_lab(
        "train.steps=2", "probes.memory.enabled=false", "logger.mode=online", "logger.init_timeout_s=3",
        run_dir=tmp_path / "run",
        env=lab_env(WANDB_API_KEY=API_KEY, WANDB_BASE_URL="http://127.0.0.1:9"),
    )
    _assert_run_finished_without_wandb(result, steps=2)
    assert "could not start" in result.stderr


def test_unwritable_wandb_dir_leaves_the_run_ok(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "wandb").write_text("a file where W&B wants its dir")
    # The lab is rank 0 of 1 in this process (as under torchrun), so the sink runs in it.
    result = run_lab_here("train.steps=2", "probes.memory.enabled=false", "logger.mode=offline", run_dir=run_dir)
    _assert_run_finished_without_wandb(result, steps=2)
    assert (run_dir / "wandb").is_file()
