"""DCP checkpoints: exact resume, resume on another mesh, atomic saves, refusal of broken
checkpoints, and recovery from a killed rank — all in real multi-process runs on CPU/gloo."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from checkpoints import assert_bitwise_equal, params
from fsdp_lab.checkpoint import META_FILE, PARTIAL_PREFIX, complete_checkpoints, resolve_resume, step_dir_name, verify
from fsdp_lab.config import ConfigError
from warm_lab import run_lab_warm

COMMON = ("logger=none", "probes.memory.enabled=false", "probes.perf.enabled=false", "checkpoint=dcp", "checkpoint.interval=3")
STEPS = 6


def lab(*overrides: str, run_dir: Path):
    return run_lab_warm(*COMMON, *overrides, run_dir=run_dir)


def ok(result):
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.summary["status"] == "ok"
    return result


def losses(result) -> list[float]:
    return [row["loss"] for row in result.metrics]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return ok(lab(f"train.steps={STEPS}", run_dir=tmp_path_factory.mktemp("uninterrupted") / "run"))


@pytest.mark.slow
def test_saves_every_interval_and_at_the_end_keeping_the_last_ones(uninterrupted):
    found = complete_checkpoints(uninterrupted.run_dir)
    assert [p.name for p in found] == [step_dir_name(3), step_dir_name(6)]
    meta = verify(found[-1])
    assert meta["step"] == 6 and meta["loss"] == losses(uninterrupted)[-1] and meta["reference"]
    assert meta["data"] == {"seed": 0, "next_step": 6, "next_sample": 6 * 2 * 4}, "6 steps of 2 ranks x 4 samples"
    assert {"rng/rank0.pt", "rng/rank1.pt", ".metadata"} <= set(meta["manifest"])
    assert all(len(entry["xxh3_64"]) == 16 for entry in meta["manifest"].values())
    assert uninterrupted.summary["checkpoint"]["last_saved"] == str(found[-1])


@pytest.mark.slow
def test_n_steps_then_resume_to_2n_is_bitwise_identical(uninterrupted, tmp_path):
    run_dir = tmp_path / "run"
    first = ok(lab(f"train.steps={STEPS // 2}", "checkpoint.async_save=true", run_dir=run_dir))
    assert [r["step"] for r in first.metrics] == [1, 2, 3]
    resumed = ok(lab(f"train.steps={STEPS}", "checkpoint.async_save=true", "checkpoint.resume=auto", run_dir=run_dir))
    assert [r["step"] for r in resumed.metrics] == list(range(1, STEPS + 1)), "metrics.jsonl is continued"
    assert losses(resumed) == losses(uninterrupted), "bitwise: the same floats"
    assert resumed.summary["final_loss"] == uninterrupted.summary["final_loss"]
    assert resumed.summary["checkpoint"]["resumed_from"] == str(run_dir / "checkpoints" / step_dir_name(3))
    assert resumed.summary["parity"]["ok"], "the restored reference keeps parity meaningful"
    assert [r["parity/loss_abs_diff"] for r in resumed.metrics] == [r["parity/loss_abs_diff"] for r in uninterrupted.metrics]
    last = step_dir_name(STEPS)
    assert_bitwise_equal(params(run_dir / "checkpoints" / last, tmp_path), params(uninterrupted.run_dir / "checkpoints" / last, tmp_path))


@pytest.mark.slow
def test_killed_rank_is_restarted_and_the_run_ends_as_if_uninterrupted(uninterrupted, tmp_path):
    result = ok(lab(
        f"train.steps={STEPS}", "checkpoint.resume=auto", "checkpoint.keep=1", "launch.max_restarts=1",
        "fault.kill_rank=1", "fault.at_step=4", run_dir=tmp_path / "run",
    ))
    assert "checkpoint: resumed from" in result.stderr and result.summary["checkpoint"]["resumed_from"].endswith(step_dir_name(3))
    assert [r["step"] for r in result.metrics] == list(range(1, STEPS + 1)), "the repeated step is written once"
    assert losses(result) == losses(uninterrupted)
    assert [p.name for p in complete_checkpoints(result.run_dir)] == [step_dir_name(STEPS)], "checkpoint.keep=1"
    last = step_dir_name(STEPS)
    assert_bitwise_equal(params(result.run_dir / "checkpoints" / last, tmp_path), params(uninterrupted.run_dir / "checkpoints" / last, tmp_path))


@pytest.fixture(scope="module")
def killed_during_save(tmp_path_factory):
    """Rank 0 dies after the shards of the last checkpoint are written, before it is made visible."""
    return lab(
        f"train.steps={STEPS}", "fault.kill_rank=0", f"fault.at_step={STEPS}", "fault.phase=save",
        run_dir=tmp_path_factory.mktemp("killed") / "run",
    )


@pytest.mark.slow
def test_without_restarts_a_killed_rank_fails_the_run_naming_it(killed_during_save):
    assert killed_during_save.returncode == 1
    assert killed_during_save.error_lines == ["error: rank 0 died from signal SIGKILL"]
    assert killed_during_save.summary["status"] == "failed"
    assert [r["step"] for r in killed_during_save.metrics] == list(range(1, STEPS + 1)), "finished steps are kept"


@pytest.mark.slow
def test_a_crash_during_save_leaves_the_previous_checkpoint_the_newest_usable(killed_during_save, uninterrupted, prepared):
    root = killed_during_save.run_dir / "checkpoints"
    partial = root / f"{PARTIAL_PREFIX}{step_dir_name(STEPS)}"
    assert partial.is_dir() and (partial / ".metadata").exists(), "the shards were written"
    assert not (partial / META_FILE).exists(), "but the save never completed"
    assert [p.name for p in complete_checkpoints(killed_during_save.run_dir)] == [step_dir_name(3)]
    newest = resolve_resume("auto", killed_during_save.run_dir)
    assert newest == root / step_dir_name(3) and verify(newest)["step"] == 3
    with pytest.raises(ConfigError, match=r"incomplete: it has no meta\.json"):
        prepared("device=cpu", f"checkpoint.resume={partial}")


@pytest.mark.slow
def test_a_corrupt_checkpoint_is_refused_with_a_clear_error(uninterrupted, tmp_path, prepared):
    broken = tmp_path / "broken"
    shutil.copytree(uninterrupted.run_dir / "checkpoints" / step_dir_name(3), broken)
    shard = next(broken.glob("*.distcp"))
    size = shard.stat().st_size
    with shard.open("r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(ConfigError, match=rf"corrupt: {shard.name} has {size // 2} bytes, expected {size}"):
        prepared("device=cpu", f"checkpoint.resume={broken}")
    with pytest.raises(ConfigError, match="checkpoint.resume=/nonexistent: no such directory"):
        prepared("device=cpu", "checkpoint.resume=/nonexistent")


def flip_bytes(file: Path) -> None:
    """Damage a file's content, keeping its size (what a bad disk or a stray write does)."""
    data = bytearray(file.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 8] = bytes(b ^ 0xFF for b in data[middle:middle + 8])
    file.write_bytes(data)


@pytest.mark.slow
def test_a_checkpoint_whose_content_changed_is_refused_naming_the_file(uninterrupted, tmp_path, prepared):
    damaged = tmp_path / "damaged"
    shutil.copytree(uninterrupted.run_dir / "checkpoints" / step_dir_name(3), damaged)
    shard = next(damaged.glob("*.distcp"))
    flip_bytes(shard)
    with pytest.raises(ConfigError, match=rf"checkpoint.resume={damaged}: corrupt: the content of {shard.name} has changed since the save"):
        prepared("device=cpu", f"checkpoint.resume={damaged}")


@pytest.mark.slow
def test_auto_resume_passes_over_a_damaged_checkpoint_to_the_newest_intact_one(uninterrupted, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(uninterrupted.run_dir, run_dir)
    damaged = run_dir / "checkpoints" / step_dir_name(STEPS)
    flip_bytes(damaged / ".metadata")
    result = ok(lab(f"train.steps={STEPS}", "checkpoint.resume=auto", run_dir=run_dir))
    warnings = [line for line in (result.stdout + result.stderr).splitlines() if f"warning: checkpoint {damaged}: corrupt" in line]
    assert warnings, "the damaged checkpoint is named"
    assert result.summary["checkpoint"]["resumed_from"] == str(run_dir / "checkpoints" / step_dir_name(3))
    assert losses(result) == losses(uninterrupted), "resumed from step 3 to the same losses"


@pytest.mark.slow
def test_resume_on_another_mesh_and_another_data_parallel_size(tmp_path):
    """Save on FSDP over 4 ranks (dp 4), resume on HSDP 2x2, save there, resume on dp 2 x tp 2 with
    the same global batch: DCP reshards, and the data continues where the uninterrupted run was."""
    four = ("mesh.world_size=4", "train.steps=4", "checkpoint.interval=1", "checkpoint.keep=4")
    hsdp = ("mesh.dp_replicate=2", "mesh.dp_shard=2")
    fsdp = ok(lab(*four, run_dir=tmp_path / "fsdp"))
    on_hsdp = ok(lab(*four, *hsdp, f"checkpoint.resume={tmp_path / 'fsdp' / 'checkpoints' / step_dir_name(2)}", run_dir=tmp_path / "hsdp"))
    on_tp = ok(lab(*four, "mesh.tp=2", "train.global_batch_size=16", f"checkpoint.resume={tmp_path / 'hsdp' / 'checkpoints' / step_dir_name(3)}", run_dir=tmp_path / "tp"))
    assert on_hsdp.summary["mesh"]["dp_replicate"] == 2 and on_tp.summary["mesh"]["tp"] == 2 and on_tp.summary["mesh"]["dp_shard"] == 2
    assert [r["step"] for r in on_hsdp.metrics] == [3, 4] and [r["step"] for r in on_tp.metrics] == [4]
    expected = losses(fsdp)
    assert losses(on_hsdp) == pytest.approx(expected[2:], abs=1e-5)
    assert losses(on_tp) == pytest.approx(expected[3:], abs=1e-5), "dp 2 x tp 2 continues with the samples of dp 4"
    print("cross-mesh losses: fsdp", expected, "hsdp from step 2", losses(on_hsdp), "dp 2 x tp 2 from hsdp step 3", losses(on_tp))


@pytest.mark.parametrize("override,message", [
    ("checkpoint.interval=0", "checkpoint.interval=0: allowed is >= 1"),
    ("checkpoint.keep=0", "checkpoint.keep=0: allowed is >= 1"),
    ("fault.phase=load", "fault.phase=load: allowed are step, save"),
])
def test_bad_checkpoint_settings_are_refused(prepared, override, message):
    with pytest.raises(ConfigError, match=message):
        prepared("device=cpu", override)
