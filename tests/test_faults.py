"""Failures during a run, in real processes: each ends the run with a message naming the cause,
`summary.json` saying so, the metrics written so far intact, and no rank process left behind."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from fsdp_lab.cli_process import REPO, lab_env, run_lab

pytestmark = [pytest.mark.fault, pytest.mark.slow]

QUICK = ("logger=none", "probes.memory.enabled=false", "model.n_layers=1")


def assert_no_rank_left(run_dir):
    """No process of this run is alive: their command lines carry the run dir."""
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(run_dir) not in out


def test_rank_that_raises_fails_the_run_naming_the_rank(tmp_path):
    result = run_lab("train.steps=4", *QUICK, "fault.kill_rank=1", "fault.at_step=2", "fault.kind=raise", run_dir=tmp_path / "run")
    assert result.returncode == 1
    assert result.error_lines == ["error: rank 1 failed: RuntimeError: injected fault: rank 1 raised at step 2"]
    s = result.summary
    assert s["status"] == "failed" and s["error"].startswith("rank 1 failed")
    assert [r["step"] for r in result.metrics] == [1, 2], "metrics of finished steps are kept"


def test_killed_rank_is_named(tmp_path):
    result = run_lab("train.steps=4", *QUICK, "fault.kill_rank=0", "fault.at_step=1", run_dir=tmp_path / "run")
    assert result.returncode == 1
    assert result.error_lines == ["error: rank 0 died from signal SIGKILL"]
    assert result.summary["status"] == "failed" and result.summary["steps"] == 1
    assert len(result.metrics) == 1


def test_hang_on_a_collective_ends_with_the_stuck_collective_named(tmp_path):
    started = time.monotonic()
    result = run_lab("train.steps=4", *QUICK, "fault.kill_rank=1", "fault.at_step=1", "fault.kind=hang",
                     "launch.timeout_s=4", run_dir=tmp_path / "run", timeout=120)
    assert result.returncode == 1
    (line,) = result.error_lines
    assert line.startswith("error: rank 0 failed: CollectiveTimeout: a collective timed out after launch.timeout_s=4s "
                           "during step 2: forward (parameter all-gather)")
    assert result.summary["status"] == "failed" and len(result.metrics) == 1
    assert time.monotonic() - started < 90
    assert_no_rank_left(tmp_path / "run")


def test_disk_full_while_writing_metrics_fails_the_run_with_the_cause(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").symlink_to("/dev/full")  # every write fails with ENOSPC, as on a full disk
    result = run_lab("train.steps=3", *QUICK, run_dir=run_dir)
    assert result.returncode == 1
    assert result.error_lines == ["error: rank 0 failed: OSError: [Errno 28] No space left on device"]
    assert result.summary["status"] == "failed"


def test_ctrl_c_interrupts_cleanly_keeping_the_metrics(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "fsdp_lab", "train.steps=500", *QUICK, f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=lab_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    metrics = run_dir / "metrics.jsonl"
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        assert time.monotonic() < deadline and proc.poll() is None, "the run never got going"
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "error: interrupted by SIGINT; every rank was stopped" in stderr
    import json

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert len(rows) >= 2 and [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    assert_no_rank_left(run_dir)


def test_two_runs_started_in_the_same_second_get_their_own_run_dirs(tmp_path):
    root = tmp_path / "runs"
    cmd = [sys.executable, "-m", "fsdp_lab", "train.steps=1", *QUICK, "probes.parity.enabled=false",
           f"hydra.run.dir={root}/${{fsdp_lab_run_id:}}"]
    procs = [subprocess.Popen(cmd, cwd=REPO, env=lab_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    assert all(p.wait(timeout=180) == 0 for p in procs)
    summaries = sorted(root.rglob("summary.json"))
    assert len(summaries) == 2 and summaries[0].parent != summaries[1].parent


def test_disk_full_while_saving_a_checkpoint_keeps_the_metrics_and_leaves_no_checkpoint_visible(tmp_path):
    import resource

    def limit_file_size():  # a write past 64 KiB fails (EFBIG; Python ignores SIGXFSZ), as on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))

    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "fsdp_lab", "checkpoint=dcp", "checkpoint.interval=2", "train.steps=4", *QUICK,
           f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(cmd, cwd=REPO, env=lab_env(), capture_output=True, text=True, timeout=300, preexec_fn=limit_file_size)
    assert proc.returncode == 1
    (line,) = [l for l in proc.stderr.splitlines() if l.startswith("error: ")]
    assert line.startswith("error: rank ")
    # The failed rank's traceback (teed to stderr) ends in the checkpoint save, where the write failed
    # (EFBIG, or torch.save's zip writer noticing the short write); elastic's own error file may not fit.
    assert "fsdp_lab/checkpoint.py" in proc.stderr
    import json

    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"
    assert [json.loads(l)["step"] for l in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert not list((run_dir / "checkpoints").glob("step_*")), "a half-written checkpoint must not count"
    assert_no_rank_left(run_dir)
