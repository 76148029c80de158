"""Training a composed config in this process on the ranks of an initialized group (a world of
one in the fast tier, torchrun's ranks in the matrices), with the lab's own `build_trainer`."""

from __future__ import annotations

from pathlib import Path

from fsdp_lab.compose import compose_run
from fsdp_lab.config import RunConfig
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.worker import build_trainer


def run_and_mesh(overrides: list[str], ctx) -> tuple[RunConfig, ParallelDims]:
    """`overrides` composed, and the run's mesh over every rank."""
    run = compose_run(*overrides)
    return run, ParallelDims.from_mesh(run.mesh, ctx.world_size)


def train(overrides: list[str], ctx, run_dir: Path | None = None):
    """Compose `overrides`, build the run's trainer over every rank and train it; returns the
    config, the trained trainer and its metric rows (`run_dir`: where probes write their files)."""
    run, dims = run_and_mesh(overrides, ctx)
    rows: list[dict] = []
    trainer = build_trainer(run, dims, ctx, on_step=rows.append, run_dir=run_dir)
    trainer.run()
    return run, trainer, rows
