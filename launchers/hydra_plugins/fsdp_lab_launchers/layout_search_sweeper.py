"""`hydra/sweeper=layout_search` (conf/hydra/sweeper/layout_search.yaml): hydra-optuna-sweeper's Optuna
sweeper, every setting as in `hydra/sweeper=optuna`, plus what the lab adds to a study (_trials.py).
Light, as Hydra imports it to list plugins: Optuna (the optional `search` extra) only when it sweeps."""

from __future__ import annotations

from typing import Any, List

from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class LayoutSearchSweeper(Sweeper):
    def __init__(self, **optuna_settings: Any) -> None:
        try:
            from ._trials import RecordingOptunaSweeper
        except ImportError as e:
            raise ImportError(f"hydra/sweeper=layout_search needs the search extra: pip install 'fsdp_lab[search]' ({e})") from None
        self.optuna = RecordingOptunaSweeper(**optuna_settings)

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.optuna.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: List[str]) -> None:
        return self.optuna.sweep(arguments)
