"""Launcher choices `hydra/launcher=torchrun|slurm` (light: Hydra imports this to list plugins)."""

from dataclasses import dataclass
from typing import Optional

from hydra.core.config_store import ConfigStore
from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf


@dataclass
class TorchrunLauncherConf:
    _target_: str = "hydra_plugins.fsdp_lab_launchers.torchrun_launcher.TorchrunLauncher"
    pack: bool = True
    """Run jobs concurrently while their ranks fit (GPUs, or max_ranks on CPU); false = one job at a time."""
    max_ranks: Optional[int] = None
    """Concurrent CPU ranks over all running jobs; null = this machine's CPU count. GPU jobs are packed
    onto disjoint visible GPUs instead."""
    max_restarts: Optional[int] = None
    """torch elastic restarts of a failed rank group, for every job; null = each job's launch.max_restarts."""


@dataclass
class SlurmLauncherConf(SlurmQueueConf):
    _target_: str = "hydra_plugins.fsdp_lab_launchers.slurm_launcher.LabSlurmLauncher"
    world_size: Optional[int] = None
    """Tasks per job (one per rank: nodes x tasks_per_node); null = from the job's mesh (explicit
    degrees or mesh.world_size, else gpus_per_node x nodes, else 2 CPU ranks). tasks_per_node is derived."""
    max_num_timeout: int = 3
    """Requeues after a time-out; each requeue resumes with checkpoint.resume=auto (preemptions are unlimited)."""


ConfigStore.instance().store(group="hydra/launcher", name="torchrun", node=TorchrunLauncherConf, provider="fsdp_lab")
ConfigStore.instance().store(group="hydra/launcher", name="slurm", node=SlurmLauncherConf, provider="fsdp_lab")
