"""The Hydra entry point: compose and check the config, then either work as a rank (the process was
started by torchrun, srun or a launcher plugin) or spawn the ranks of the run."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from fsdp_lab.checkpoint import newest_intact
from fsdp_lab.config import ConfigError, RunConfig, register_schema
from fsdp_lab.dist import is_rank_process, resolve_device_type
from fsdp_lab.objective import ObjectiveMissing, objective_value
from fsdp_lab.rundir import register_resolvers
from fsdp_lab.search_space import register_search_resolvers
from fsdp_lab.sinks.files import METRICS_FILE, read_summary, write_summary
from fsdp_lab.sweep import label_sweep_job
from fsdp_lab.validate import prepare
from fsdp_lab.worker import base_summary

register_schema()
register_resolvers()
register_search_resolvers()

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")


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


def returned_objective(run: RunConfig, run_dir: Path) -> float | None:
    """What the task function hands a Hydra sweeper: the finished run's sweep.objective."""
    try:
        return objective_value(run, run_dir)
    except ObjectiveMissing as e:
        fail(str(e), code=1)


def execute(cfg: DictConfig, run_dir: Path) -> float | None:
    """Run one composed config in `run_dir` and return its sweep.objective (rank 0 and the parent; None
    without one); exits non-zero with a one-line message on failure."""
    try:
        run, dims = prepare(cfg)
    except ConfigError as e:
        if os.environ.get("RANK", "0") == "0":
            discard_unstarted_run_dir(run_dir)
        fail(str(e), code=2)
    run = label_sweep_job(run, HydraConfig.get())
    if run.mode == "estimate":
        from fsdp_lab.estimate import run_estimate

        run_estimate(run, dims, run_dir)
        print(f"run dir: {run_dir}", flush=True)
        return
    if run.mode == "plan":
        from fsdp_lab.plan.run import run_plan

        run_plan(run, run_dir, list(HydraConfig.get().overrides.task))
        print(f"run dir: {run_dir}", flush=True)
        return
    if is_rank_process():
        from fsdp_lab.worker import rank_main

        try:
            rank_main(run, str(run_dir), dims)
        finally:
            if os.environ["RANK"] == "0":
                print(f"run dir: {run_dir}", flush=True)
        return returned_objective(run, run_dir) if os.environ["RANK"] == "0" else None
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
    return returned_objective(run, run_dir)


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    return execute(cfg, Path(HydraConfig.get().runtime.output_dir))
