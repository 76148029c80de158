"""`python -m fsdp_lab.report` on a real 4-job sweep in which two jobs fail. Hydra's basic launcher
runs it, which leaves no sweep summary when a job fails: the report has only the job dirs to go by.
Both commands are worked in this process (tests/in_process.py): the sweep's jobs are 1-rank runs."""

from __future__ import annotations

import json
import struct

import pytest

from in_process import report_here, run_lab_here

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOTS = ("memory_per_phase.png", "loss_and_parity.png", "memory_vs_step_time.png")
# job -> (its distinguishing overrides, status)
JOBS = {
    "0": ("optim=adamw,fault={kill_rank:0,at_step:2,kind:raise}", "failed"),
    "1": ("optim=adamw,fault={}", "ok"),
    "2": ("optim=sgd,fault={kill_rank:0,at_step:2,kind:raise}", "failed"),
    "3": ("optim=sgd,fault={}", "ok"),
}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    sweep_dir = tmp_path_factory.mktemp("report") / "sweep"
    # One rank, worked in this process (the basic launcher runs jobs in-process). Jobs with the
    # fault raise at their third step; the others have none (a fault that never fires is refused).
    result = run_lab_here(
        "-m", "hydra/launcher=basic", "optim=adamw,sgd", "fault={kill_rank:0,at_step:2,kind:raise},{}",
        "train.steps=3", "logger=none", "debug=cpu_tiny", f"hydra.sweep.dir={sweep_dir}",
    )
    assert result.returncode == 1, "Hydra re-raises the failed jobs' error after the sweep"
    assert sorted(p.name for p in sweep_dir.iterdir() if p.is_dir()) == list(JOBS)
    assert not (sweep_dir / "sweep_summary.json").exists()
    made = report_here(sweep_dir)
    assert made.returncode == 0, made.stderr[-3000:]
    return sweep_dir


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.mark.slow  # the sweep fixture trains its jobs in process: seconds of CPU
def test_plots_exist_and_are_not_empty(sweep):
    for name in PLOTS:
        path = sweep / "plots" / name
        width, height = png_size(path)
        assert width >= 600 and height >= 400 and path.stat().st_size > 15_000, f"{name} looks empty"


@pytest.mark.slow
def test_markdown_table_has_every_job(sweep):
    md = (sweep / "report.md").read_text()
    assert "Common overrides: `train.steps=3 logger=none debug=cpu_tiny`" in md
    rows = {line.split(" | ")[0].lstrip("| "): line for line in md.splitlines() if line.startswith("| ") and "---" not in line}
    for num, (label, status) in JOBS.items():
        summary = json.loads((sweep / num / "summary.json").read_text())
        cells = [c.strip() for c in rows[num].strip("|").split(" | ")]
        assert cells[1] == label and cells[2] == status == summary["status"]
        if status == "ok":
            assert cells[3].startswith("ok (Δloss") and summary["parity"]["ok"]
            assert float(cells[5]) == pytest.approx(summary["memory"]["peak_mib"], abs=0.006)
            assert float(cells[6]) == pytest.approx(summary["perf"]["step_time_s"] * 1e3, abs=0.06)
            assert float(cells[7].replace(",", "")) == pytest.approx(summary["perf"]["tokens_per_s"], abs=0.6)
        else:
            # A failed job has no probe summaries; its two finished steps still give figures.
            metrics = [json.loads(line) for line in (sweep / num / "metrics.jsonl").read_text().splitlines()]
            assert len(metrics) == 2
            assert cells[3] == f"no verdict (Δloss {max(r['parity/loss_abs_diff'] for r in metrics):.1e} in 2 steps)"
            assert float(cells[5]) == pytest.approx(max(r["memory/peak_mib"] for r in metrics), abs=0.006)
    assert "#0: failed: rank 0: RuntimeError: injected fault: rank 0 raised at step 2" in md
    for name in PLOTS:
        assert f"](plots/{name})" in md


@pytest.mark.slow
def test_html_shows_the_same_jobs_and_plots(sweep):
    page = (sweep / "report.html").read_text()
    for label, status in JOBS.values():
        assert f"<td>{label}</td><td>{status}</td>" in page
    for name in PLOTS:
        assert f'<img src="plots/{name}"' in page


@pytest.mark.slow
def test_report_of_a_single_run_dir(sweep):
    made = report_here(sweep / "3")
    assert made.returncode == 0, made.stderr[-3000:]
    md = (sweep / "3" / "report.md").read_text()
    assert "(1 job)" in md
    assert "| 3 | optim=sgd,fault={},train.steps=3,logger=none,debug=cpu_tiny" in md
    assert all((sweep / "3" / "plots" / name).stat().st_size > 0 for name in PLOTS)


def test_a_dir_that_is_no_run_is_refused(tmp_path):
    made = report_here(tmp_path)
    assert made.returncode == 1
    assert made.stderr.strip() == f"error: {tmp_path}: neither a run dir (summary.json, metrics.jsonl) nor a sweep dir (0/, 1/, ...)"
