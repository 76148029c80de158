"""metrics.jsonl (one JSON object per optimizer step, flushed as written so a crash keeps every
finished step) and summary.json (written aside, then renamed, so it is never half-written)."""

from __future__ import annotations

import contextlib
import json
import math
import os
from pathlib import Path

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"


def _finite_or_none(value):
    return None if isinstance(value, float) and not math.isfinite(value) else value


class MetricsFile:
    def __init__(self, run_dir: Path, *, append: bool):
        self.path = run_dir / METRICS_FILE
        self._file = open(self.path, "a" if append else "w")

    def write(self, row: dict) -> None:
        self._file.write(json.dumps({k: _finite_or_none(v) for k, v in row.items()}) + "\n")
        self._file.flush()

    def close(self) -> None:
        # A write that failed (disk full) leaves its data buffered and close() would fail on it again;
        # the failure was already raised where it happened.
        with contextlib.suppress(OSError):
            self._file.close()


def keep_metrics_through(run_dir: Path, step: int) -> None:
    """Drop the rows after `step`: a run resumed from `step` computes them again."""
    path = run_dir / METRICS_FILE
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines(keepends=True) if json.loads(line)["step"] <= step]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(kept))
    os.replace(tmp, path)


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def write_summary(run_dir: Path, summary: dict) -> None:
    write_json_atomic(run_dir / SUMMARY_FILE, summary)


def read_summary(run_dir: Path) -> dict | None:
    path = run_dir / SUMMARY_FILE
    return json.loads(path.read_text()) if path.exists() else None
