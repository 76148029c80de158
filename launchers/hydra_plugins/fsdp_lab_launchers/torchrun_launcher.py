"""`hydra/launcher=torchrun`: every sweep job is a multi-rank run spawned through torch elastic on this
machine, jobs packed side by side while their ranks fit (see _core.py)."""

from __future__ import annotations

from typing import Optional, Sequence

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class TorchrunLauncher(Launcher):
    def __init__(self, pack: bool, max_ranks: Optional[int], max_restarts: Optional[int]) -> None:
        self.pack, self.max_ranks, self.max_restarts = pack, max_ranks, max_restarts
        self.config: Optional[DictConfig] = None
        self.task_function: Optional[TaskFunction] = None
        self.hydra_context: Optional[HydraContext] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from ._core import launch_torchrun

        return launch_torchrun(self, job_overrides, initial_job_idx)
