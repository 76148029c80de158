"""`hydra/launcher=slurm`: hydra-submitit-launcher's SLURM launcher, one SLURM task per rank.

Each job is submitted with nodes x tasks_per_node = its world size; every task becomes a rank from
SLURM's environment and runs the lab's entry point, which works as that rank. On preemption or
time-out submitit requeues the job, which resumes with `checkpoint.resume=auto`."""

from functools import partial
from typing import Any, Optional, Sequence

from hydra.core.utils import JobReturn
from hydra_plugins.hydra_submitit_launcher import submitit_launcher

RESUME_OVERRIDE = "checkpoint.resume=auto"


class LabSlurmLauncher(submitit_launcher.SlurmLauncher):
    def __init__(self, world_size: Optional[int] = None, **params: Any) -> None:
        super().__init__(**params)
        self.world_size = world_size

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from ._core import launch_slurm

        return launch_slurm(self, super().launch, job_overrides, initial_job_idx)

    def __call__(self, sweep_overrides, job_dir_key, job_num, job_id, singleton_state) -> JobReturn:
        from ._core import run_slurm_rank

        return run_slurm_rank(partial(super().__call__, sweep_overrides, job_dir_key, job_num, job_id, singleton_state))

    def checkpoint(self, sweep_overrides, *args: Any, **kwargs: Any) -> Any:
        """The requeued job resumes from the newest complete checkpoint of its run dir."""
        overrides = [o for o in sweep_overrides if not o.startswith("checkpoint.resume=")] + [RESUME_OVERRIDE]
        return super().checkpoint(overrides, *args, **kwargs)
