"""One run directory per run, resolved once even when every rank composes the config itself.

The id is shared by all ranks of one launch: our own spawner and launcher plugins pass it in the
environment; under torchrun it is derived from the agent process that started the ranks (its pid
and start time are the same for all of them); under SLURM from the job and step ids. A run started
on its own gets the time plus its pid, so two runs started in the same second never collide."""

from __future__ import annotations

import os
import time
from pathlib import Path

from omegaconf import OmegaConf

RUN_ID_ENV = "FSDP_LAB_RUN_ID"


def _stamp(epoch_s: float) -> str:
    return time.strftime("%Y-%m-%d/%H-%M-%S", time.localtime(epoch_s))


def _process_start_epoch(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    start_ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, counted after "(comm)"
    boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime"))
    return boot + start_ticks / os.sysconf("SC_CLK_TCK")


def run_id() -> str:
    if os.environ.get(RUN_ID_ENV):
        return os.environ[RUN_ID_ENV]
    if "TORCHELASTIC_RUN_ID" in os.environ:  # a rank started by torchrun
        agent = os.getppid()
        return f"{_stamp(_process_start_epoch(agent))}-torchrun{agent}"
    if "SLURM_JOB_ID" in os.environ:
        return f"{_stamp(time.time())}-slurm{os.environ['SLURM_JOB_ID']}.{os.environ.get('SLURM_STEP_ID', 0)}"
    return f"{_stamp(time.time())}-{os.getpid()}"


def hydra_output_subdir() -> str | None:
    """Only rank 0 (or a process that is not a rank) writes `.hydra/` into the shared run dir."""
    return ".hydra" if os.environ.get("RANK", "0") == "0" else None


def register_resolvers() -> None:
    OmegaConf.register_new_resolver("fsdp_lab_run_id", run_id, use_cache=True, replace=True)
    OmegaConf.register_new_resolver("fsdp_lab_output_subdir", hydra_output_subdir, replace=True)
