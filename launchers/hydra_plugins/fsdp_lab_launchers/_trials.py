"""What the lab adds to hydra-optuna-sweeper 1.3.0's study (its sweeper asks a batch of trials, calls
launcher.launch once for the batch, then tells each trial COMPLETE with float(return_value), or FAIL
when reading a failed JobReturn's value raises):

- every trial keeps its job's run dir (user attribute `run_dir`), and a failed one the lab's one-line
  reason (`fail_reason`: a refusal before any rank started, or the rank's error): Optuna 2 stores none;
- an SQLite study's folder is made, so `storage: sqlite:///outputs/studies/NAME.db` needs no mkdir, and
  the sweep dir, where the sweeper writes its results even when every trial was a repeat;
- a trial whose layout a completed trial of the study already measured is not run again: it takes that
  trial's value (user attribute `repeat_of`: its number; `run_dir`: its run dir). TPE, once it has a
  good point, proposes it again and again (a 2-GPU study of 25 trials measured one layout 12 times), and
  a repeat would cost a run's GPU time to learn what the study holds;
- the mesh is one parameter, `mesh.degrees=pp1-rep2-tp1`, spelled out as the lab's mesh keys for the job
  (fsdp_lab/search_space.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import optuna
from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import CompactHydraException
from hydra_plugins.hydra_optuna_sweeper._impl import OptunaSweeperImpl
from omegaconf import DictConfig

from fsdp_lab.search_space import expand_mesh

SQLITE = "sqlite:///"


def record(trial, ret: JobReturn) -> None:
    hydra = ret.hydra_cfg.hydra
    run_dir = Path(hydra.sweep.dir) / str(hydra.sweep.subdir)
    if run_dir.exists():  # a job refused before it started has none
        trial.set_user_attr("run_dir", str(run_dir))
    if ret.status is not JobStatus.COMPLETED:
        error = ret._return_value
        trial.set_user_attr("fail_reason", getattr(error, "reason", None) or f"{type(error).__name__}: {error}")


def measured_before(trial):
    """The study's completed trial with this trial's parameters, if any."""
    done = trial.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    return next((t for t in done if t.params == trial.params), None)


def repeat(trial, earlier, overrides: Sequence[str]) -> JobReturn:
    trial.set_user_attr("repeat_of", earlier.number)
    if "run_dir" in earlier.user_attrs:
        trial.set_user_attr("run_dir", earlier.user_attrs["run_dir"])
    return JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED, _return_value=earlier.value)


class NoTrialCompleted(CompactHydraException):
    """Every trial of the study failed: there is no best one (Hydra prints only this line)."""


class RecordingLauncher:
    """The sweeper's launcher: runs the batch's new layouts, records each returned job on the trial it
    ran, and answers a repeated layout from the study."""

    def __init__(self, launcher, sweeper: "RecordingOptunaSweeper") -> None:
        self.launcher, self.sweeper = launcher, sweeper

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        earlier = [measured_before(trial) for trial in self.sweeper.batch]
        new = [overrides for overrides, before in zip(job_overrides, earlier) if before is None]
        ran = iter(self.launcher.launch(new, initial_job_idx=initial_job_idx) if new else [])
        returns = []
        for trial, overrides, before in zip(self.sweeper.batch, job_overrides, earlier):
            if before is None:
                returns.append(next(ran))
                record(trial, returns[-1])
            else:
                returns.append(repeat(trial, before, overrides))
        return returns


class RecordingOptunaSweeper(OptunaSweeperImpl):
    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self.batch: list = []

    def setup(self, *, hydra_context, task_function, config: DictConfig) -> None:
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        self.launcher = RecordingLauncher(self.launcher, self)
        Path(config.hydra.sweep.dir).mkdir(parents=True, exist_ok=True)
        if isinstance(self.storage, str) and self.storage.startswith(SQLITE):
            Path(self.storage[len(SQLITE):]).parent.mkdir(parents=True, exist_ok=True)

    def sweep(self, arguments: list[str]) -> None:
        try:
            return super().sweep(arguments)
        except ValueError as e:  # optuna 2's study.best_trial, read at the end, when no trial completed
            if "Record does not exist" not in str(e) and "No trials are completed" not in str(e):
                raise
            raise NoTrialCompleted(f"error: no trial of study {self.study_name} completed; each failed trial's "
                                   "reason is its user attribute fail_reason") from None

    def _configure_trials(self, trials, *args: Any):
        self.batch = list(trials)  # the batch the next launch runs, in the order of its jobs
        return [expand_mesh(list(overrides)) for overrides in super()._configure_trials(trials, *args)]
