"""mode=train from the command line: work as this rank (the process was started by torchrun, srun or a
launcher plugin) or spawn the ranks of the run; a failed spawn is recorded in the run dir."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from fsdp_lab.checkpoint import newest_intact
from fsdp_lab.config import RunConfig
from fsdp_lab.dist import is_rank_process, resolve_device_type
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.sinks.files import METRICS_FILE, read_summary, write_summary
from fsdp_lab.worker import base_summary


def fail(message: str, code: int) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def discard_unstarted_run_dir(run_dir: Path) -> None:
    """A run refused before it started leaves nothing behind (Hydra made the dir already)."""
    if not (run_dir / METRICS_FILE).exists():
        shutil.rmtree(run_dir, ignore_errors=True)


def record_spawn_failure(run_dir: Path, summary: dict, status: str, error: str) -> None:
    """The parent knows which rank failed first; rank 0 may have died before writing anything."""
    written = read_summary(run_dir)
    if written is None:
        metrics = run_dir / METRICS_FILE
        written = {**summary, "steps": sum(1 for _ in metrics.open()) if metrics.exists() else 0}
    written.update(status=status, error=error)
    write_summary(run_dir, written)


def train(run: RunConfig, dims: ParallelDims, run_dir: Path) -> None:
    """Train `run` in `run_dir`; exits non-zero with a one-line message when a rank fails."""
    if is_rank_process():
        from fsdp_lab.worker import rank_main

        try:
            rank_main(run, str(run_dir), dims)
        finally:
            if os.environ["RANK"] == "0":
                print(f"run dir: {run_dir}", flush=True)
        return
    from fsdp_lab.spawn import Interrupted, RankFailed, spawn_ranks

    if run.checkpoint.resume == "auto":
        newest_intact(run_dir)  # a damaged checkpoint is named before any rank starts

    try:
        spawn_ranks(run, dims, run_dir)
    except (RankFailed, Interrupted) as e:
        status, code = ("failed", 1) if isinstance(e, RankFailed) else ("interrupted", 130)
        record_spawn_failure(run_dir, base_summary(run, dims, resolve_device_type(run.device)), status, str(e))
        print(f"run dir: {run_dir}", flush=True)
        fail(str(e), code=code)
    print(f"run dir: {run_dir}", flush=True)
