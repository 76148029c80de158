"""The Hydra entry point: compose and check the config, then do what its mode does (validate.MODES:
train as a rank or spawn the ranks, estimate, plan)."""

from __future__ import annotations

import os
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from fsdp_lab.compose import CONF_DIR
from fsdp_lab.config import ConfigError, RunConfig
from fsdp_lab.launch import discard_unstarted_run_dir, fail
from fsdp_lab.layout_auto import apply_layout
from fsdp_lab.objective import ObjectiveMissing, objective_value
from fsdp_lab.sweep import label_sweep_job
from fsdp_lab.validate import MODES, prepare


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
        run, dims = prepare(apply_layout(cfg, list(HydraConfig.get().overrides.task)))
    except ConfigError as e:
        if os.environ.get("RANK", "0") == "0":
            discard_unstarted_run_dir(run_dir)
        fail(str(e), code=2)
    run = label_sweep_job(run, HydraConfig.get())
    MODES[run.mode].execute(run, dims, run_dir, list(HydraConfig.get().overrides.task))
    return returned_objective(run, run_dir) if os.environ.get("RANK", "0") == "0" else None


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    return execute(cfg, Path(HydraConfig.get().runtime.output_dir))
