"""The Hydra entry point: compose and check the config, then do what its mode does (validate.MODES:
train as a rank or spawn the ranks, estimate, plan)."""

from __future__ import annotations

import os
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from fsdp_lab.compose import CONF_DIR
from fsdp_lab.config import ConfigError
from fsdp_lab.launch import discard_unstarted_run_dir, fail
from fsdp_lab.layout_auto import apply_layout
from fsdp_lab.sweep import label_sweep_job
from fsdp_lab.validate import MODES, prepare


def execute(cfg: DictConfig, run_dir: Path) -> None:
    """Run one composed config in `run_dir`; exits non-zero with a one-line message on failure."""
    try:
        run, dims = prepare(apply_layout(cfg, list(HydraConfig.get().overrides.task)))
    except ConfigError as e:
        if os.environ.get("RANK", "0") == "0":
            discard_unstarted_run_dir(run_dir)
        fail(str(e), code=2)
    run = label_sweep_job(run, HydraConfig.get())
    MODES[run.mode].execute(run, dims, run_dir, list(HydraConfig.get().overrides.task))


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    execute(cfg, Path(HydraConfig.get().runtime.output_dir))
