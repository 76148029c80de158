"""What identifies a job of a Hydra multirun: the sweep it belongs to (W&B `group`) and the
overrides that set it apart from its siblings (W&B run `name`, report rows).

Everything comes from Hydra's own files and config, so it holds whichever launcher ran the job:
the sweeper writes the sweep's overrides to `<sweep dir>/multirun.yaml` before any job starts,
and Hydra writes each job's overrides to `<job dir>/.hydra/overrides.yaml`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from fsdp_lab.config import RunConfig

MULTIRUN_FILE = "multirun.yaml"
JOB_OVERRIDES_FILE = Path(".hydra") / "overrides.yaml"


def sweep_group(sweep_dir: str | Path) -> str:
    """The sweep's name: its dir below `sweeps/` (the default `outputs/sweeps/<date>/<time-id>`),
    else the dir's own name (`hydra.sweep.dir=.../mesh_study` -> `mesh_study`)."""
    parts = Path(sweep_dir).parts
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] == "sweeps":
            return "/".join(parts[i + 1 :])
    return parts[-1]


def swept_keys(sweep_overrides: list[str]) -> set[str]:
    """Keys the sweep varies (`optim=adamw,sgd` -> `optim`)."""
    parsed = OverridesParser.create().parse_overrides(sweep_overrides)
    return {o.key_or_group for o in parsed if o.is_sweep_override()}


def job_label(job_overrides: list[str], varied: set[str] | None) -> str:
    """`mesh=hsdp,ac=full`: the job's overrides of the swept keys, or all of them when the sweep's
    keys are unknown; empty when the job has none."""
    parsed = OverridesParser.create().parse_overrides(job_overrides)
    kept = [o.input_line for o in parsed if varied is None or o.key_or_group in varied]
    return ",".join(kept)


def read_sweep_overrides(sweep_dir: Path) -> list[str] | None:
    path = sweep_dir / MULTIRUN_FILE
    if not path.exists():
        return None
    return list(OmegaConf.load(path).hydra.overrides.task)


def read_job_overrides(job_dir: Path) -> list[str]:
    path = job_dir / JOB_OVERRIDES_FILE
    return list(OmegaConf.load(path)) if path.exists() else []


def label_sweep_job(run: RunConfig, hydra_cfg: DictConfig) -> RunConfig:
    """In a multirun, the run as its sweep's job: `logger.group` = the sweep (unless set) and
    `name` = its distinguishing overrides (unless `name` was overridden). Single runs stay as they are."""
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return run
    sweep_dir = Path(hydra_cfg.sweep.dir)
    overrides = list(hydra_cfg.overrides.task)
    sweep_overrides = read_sweep_overrides(sweep_dir)
    label = job_label(overrides, swept_keys(sweep_overrides) if sweep_overrides is not None else None)
    name_overridden = any(o.key_or_group == "name" for o in OverridesParser.create().parse_overrides(overrides))
    return replace(
        run,
        name=run.name if name_overridden or not label else label,
        logger=replace(run.logger, group=run.logger.group or sweep_group(sweep_dir)),
    )
