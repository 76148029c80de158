"""sweep_summary.json: one row per job, read back from each job's run dir. The launcher writes it
itself because Hydra skips `on_multirun_end` when a job failed."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Sequence

from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import CompactHydraException

from fsdp_lab.sinks.files import read_summary, write_json_atomic

SWEEP_SUMMARY_FILE = "sweep_summary.json"


class JobFailed(CompactHydraException):
    """A sweep job failed; Hydra prints only this message (no traceback) and exits 1. `reason`: the
    job's own one-line error (its row's), without the sweep's words around it."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def job_row(num: int, overrides: Sequence[str], run_dir: Path, *, exited_ok: bool, fallback_error: str,
            wall_s: float | None = None) -> dict:
    """The job's status (its process and its summary.json must both say ok) and key metrics."""
    s = read_summary(run_dir) or {}
    ok = exited_ok and s.get("status") == "ok"
    parity, memory, perf = s.get("parity") or {}, s.get("memory") or {}, s.get("perf") or {}
    return {
        "job": num, "overrides": list(overrides), "run_dir": str(run_dir),
        "status": "ok" if ok else "failed", "error": None if ok else (s.get("error") or fallback_error),
        "wall_s": None if wall_s is None else round(wall_s, 2),
        "steps": s.get("steps"), "world_size": s.get("world_size"), "device": s.get("device"),
        "final_loss": s.get("final_loss"), "parity_ok": parity.get("ok"),
        "max_loss_abs_diff": parity.get("max_loss_abs_diff"), "peak_mib": memory.get("peak_mib"),
        "step_time_s": perf.get("step_time_s"), "tokens_per_s": perf.get("tokens_per_s"),
        "checks": {spec: v["ok"] for spec, v in (s.get("checks") or {}).items()},
    }


def describe(row: dict) -> str:
    return f"job {row['job']} [{' '.join(row['overrides'])}]"


def earlier_rows(sweep_dir: Path, first_job: int) -> list[dict]:
    """The rows of this sweep's earlier batches: a sweeper that asks for jobs batch by batch (Optuna)
    launches several times into one sweep dir, numbering on; a sweep starting at job 0 starts afresh."""
    path = sweep_dir / SWEEP_SUMMARY_FILE
    if first_job == 0 or not path.exists():
        return []
    return [row for row in json.loads(path.read_text())["jobs"] if row["job"] < first_job]


def finish_sweep(sweep_dir: Path, rows: list[dict], returns: list[JobReturn], *, first_job: int = 0) -> None:
    """Write the sweep summary (this batch's rows after the earlier batches'), mark failed returns with a
    one-line JobFailed each, and say which jobs failed; Hydra's basic sweeper then raises the first of
    them, so the command exits non-zero (Optuna records them as failed trials and goes on)."""
    write_json_atomic(sweep_dir / SWEEP_SUMMARY_FILE, {"jobs": earlier_rows(sweep_dir, first_job) + rows})
    failed = [row for row in rows if row["status"] != "ok"]
    for row, ret in zip(rows, returns):
        if row["status"] == "ok":
            ret.status = JobStatus.COMPLETED
        else:
            ret.status = JobStatus.FAILED
            ret.return_value = JobFailed(f"error: {describe(row)} failed: {row['error']} (run dir: {row['run_dir']})", row["error"])
    print(f"sweep summary: {sweep_dir / SWEEP_SUMMARY_FILE} ({len(rows) - len(failed)} ok, {len(failed)} failed)", flush=True)
    verdicts = [(row, spec, ok) for row in rows for spec, ok in row["checks"].items()]
    if verdicts:
        broken = [f"{describe(row)} {spec}" for row, spec, ok in verdicts if ok is False]
        print(f"checks: {sum(ok is True for *_, ok in verdicts)} of {len(verdicts)} hold"
              + (f"; failed: {'; '.join(broken)}" if broken else ""), flush=True)
    if failed:
        names = "; ".join(f"{describe(row)}: {row['error']}" for row in failed)
        print(f"error: {len(failed)} of {len(rows)} sweep jobs failed: {names}", flush=True, file=sys.stderr)
