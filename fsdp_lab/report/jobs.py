"""The jobs of a run dir or a sweep dir, read from what each run wrote. A sweep is scanned rather
than trusted to have a summary of its own: Hydra skips its end-of-sweep callbacks when a job fails."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser

from fsdp_lab.memory_phases import PHASES
from fsdp_lab.sinks.files import METRICS_FILE, SUMMARY_FILE, read_summary
from fsdp_lab.sweep import JOB_OVERRIDES_FILE, job_label, read_job_overrides


@dataclass
class Job:
    num: str
    dir: Path
    overrides: list[str]
    summary: dict | None
    rows: list[dict]
    label: str = ""
    """The overrides that set this job apart from the others of its sweep."""

    @property
    def parity(self) -> dict:
        return (self.summary or {}).get("parity") or {}

    @property
    def status(self) -> str:
        if self.summary:
            return self.summary["status"]
        return "incomplete" if self.rows else "not started"

    @property
    def parity_ok(self) -> bool | None:
        """True/False for the verdict, None when parity was not checked (or the run never finished)."""
        return self.parity.get("ok") if self.parity.get("enabled") else None

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of a metric over the steps that logged it."""
        pts = [(r["step"], r[key]) for r in self.rows if r.get(key) is not None]
        return [s for s, _ in pts], [v for _, v in pts]

    def _summary_or_rows(self, section: str, key: str, metric: str, reduce) -> float | None:
        value = ((self.summary or {}).get(section) or {}).get(key)
        if value is None:
            values = self.series(metric)[1]
            value = reduce(values) if values else None
        return value

    @property
    def peak_mib(self) -> float | None:
        return self._summary_or_rows("memory", "peak_mib", "memory/peak_mib", max)

    @property
    def step_time_s(self) -> float | None:
        return self._summary_or_rows("perf", "step_time_s", "perf/step_time_s", statistics.median)

    @property
    def tokens_per_s(self) -> float | None:
        return self._summary_or_rows("perf", "tokens_per_s", "perf/tokens_per_s", statistics.median)

    @property
    def final_loss(self) -> float | None:
        losses = self.series("loss")[1]
        return losses[-1] if losses else None

    @property
    def phases_mib(self) -> dict[str, float]:
        """Memory at each phase of the last step that measured it."""
        for row in reversed(self.rows):
            if row.get("memory/start_mib") is not None:
                return {p: row[f"memory/{p}_mib"] for p in PHASES if row.get(f"memory/{p}_mib") is not None}
        return {}


def is_run_dir(path: Path) -> bool:
    return any((path / name).exists() for name in (SUMMARY_FILE, METRICS_FILE, JOB_OVERRIDES_FILE))


def read_job(num: str, run_dir: Path) -> Job:
    metrics = run_dir / METRICS_FILE
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.exists() else []
    return Job(num=num, dir=run_dir, overrides=read_job_overrides(run_dir), summary=read_summary(run_dir), rows=rows)


def collect_jobs(path: Path) -> list[Job]:
    """One job for a run dir; for a sweep dir, every numbered job dir in job order."""
    if is_run_dir(path):
        jobs = [read_job(path.name, path)]
    else:
        nums = sorted((int(p.name) for p in path.iterdir() if p.is_dir() and p.name.isdigit() and is_run_dir(p)))
        if not nums:
            raise ValueError(f"{path}: neither a run dir (summary.json, metrics.jsonl) nor a sweep dir (0/, 1/, ...)")
        jobs = [read_job(str(n), path / str(n)) for n in nums]
    varied = varied_keys(jobs)
    for job in jobs:
        job.label = job_label(job.overrides, varied)
    return jobs


def _by_key(overrides: list[str]) -> dict[str, str]:
    return {o.key_or_group: o.input_line for o in OverridesParser.create().parse_overrides(overrides)}


def varied_keys(jobs: list[Job]) -> set[str] | None:
    """Keys whose override differs between the jobs; None (every key) for a lone job."""
    if len(jobs) < 2:
        return None
    per_job = [_by_key(j.overrides) for j in jobs]
    keys = set().union(*per_job)
    return {k for k in keys if len({o.get(k) for o in per_job}) > 1}


def common_overrides(jobs: list[Job]) -> list[str]:
    """The overrides every job shares (shown once instead of in every row)."""
    varied = varied_keys(jobs)
    if varied is None:
        return []
    return [line for key, line in _by_key(jobs[0].overrides).items() if key not in varied]
