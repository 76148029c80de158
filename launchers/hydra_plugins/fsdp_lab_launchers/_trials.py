"""What the lab adds to hydra-optuna-sweeper 1.3.0's study (its sweeper asks a batch of trials, calls
launcher.launch once for the batch, then tells each trial COMPLETE with float(return_value), or FAIL
when reading a failed JobReturn's value raises):

- every trial keeps its job's run dir (user attribute `run_dir`), and a failed one the lab's one-line
  reason (`fail_reason`: a refusal before any rank started, or the rank's error): Optuna 2 stores none;
- an SQLite study's folder is made, so `storage: sqlite:///outputs/studies/NAME.db` needs no mkdir, and
  the sweep dir, where the sweeper writes its results even when every trial was a repeat;
- a layout the study already tried is never run again. TPE, once it holds a good point, proposes it
  again and again (a 2-GPU study of 25 trials measured one layout 12 times). The repeated trial gets the
  earlier trial's outcome (its value, or its failure and `fail_reason`; user attributes `repeat_of`: its
  number, `run_dir`: its run dir), and its place in the batch goes to a layout the study has not tried,
  drawn at random over the choices (seeded by the study's size; the repeat gets `replaced: true` and is
  not one of n_trials): every trial of n_trials is a new layout while one is left. Where none is left (or a parameter is not a choice) the repeat stays, answered from
  the study at no GPU time. A trial cut short (`interrupted`) does not count as tried;
- a resumed study's sampler draws anew: every invocation builds its sampler with the config's seed, so
  each resumed one replayed the same draws (the 8B study, resumed a trial at a time, was proposed its
  first trial's layout at every other trial). Its generators are seeded by the study's size as well;
- the mesh is one parameter, `mesh.degrees=pp1-rep2-tp1`, spelled out as the lab's mesh keys for the job
  (fsdp_lab/search_space.py)."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any, Sequence

import numpy as np
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


INTERRUPTED = "interrupted"  # fail_reason's start for a trial that never finished (benchmarks/plan_vs_search.py)
FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)


class RepeatedFailure(Exception):
    """The failure (its fail_reason) of the earlier trial a repeat stands for."""


def tried(study) -> list:
    """The study's trials that tried their layout: all but those cut short (INTERRUPTED), which may run again."""
    return [t for t in study.get_trials(deepcopy=False) if not t.user_attrs.get("fail_reason", "").startswith(INTERRUPTED)]


def tried_before(trial):
    """The study's earlier finished trial with this trial's parameters, if any."""
    return next((t for t in tried(trial.study) if t.state in FINISHED and t.number != trial.number and t.params == trial.params), None)


def mark_repeat(trial, earlier) -> None:
    trial.set_user_attr("repeat_of", earlier.number)
    for attr in ("run_dir", "fail_reason"):
        if attr in earlier.user_attrs:
            trial.set_user_attr(attr, earlier.user_attrs[attr])


def repeat(trial, earlier, overrides: Sequence[str]) -> JobReturn:
    """The job a repeated trial would have run, answered with the earlier trial's outcome."""
    mark_repeat(trial, earlier)
    if earlier.state == optuna.trial.TrialState.COMPLETE:
        return JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED, _return_value=earlier.value)
    return JobReturn(overrides=list(overrides), status=JobStatus.FAILED, _return_value=RepeatedFailure(earlier.user_attrs.get("fail_reason", "")))


def untried(study, search_space: dict) -> dict | None:
    """A point of the search space no trial of the study tried (refused and failed ones did), at random;
    None when every point was tried or a parameter is not a choice."""
    if not all(isinstance(d, optuna.distributions.CategoricalDistribution) for d in search_space.values()):
        return None
    seen = {tuple(sorted(t.params.items())) for t in tried(study)}
    names = sorted(search_space)
    left = [dict(zip(names, values)) for values in itertools.product(*(search_space[n].choices for n in names))
            if tuple(sorted(zip(names, values))) not in seen]
    return random.Random(len(seen)).choice(left) if left else None


def stored_trials(storage, study_name: str) -> int:
    """The trials of the stored study the sweep resumes (0: a new study, or one kept in memory)."""
    if storage is None:
        return 0
    try:
        return len(optuna.load_study(study_name=study_name, storage=storage).trials)
    except KeyError:  # optuna 2: no study of that name yet
        return 0


def reseed(sampler, study_size: int) -> None:
    """Seed the sampler's generators (TPE's and the random sampler's inside it; optuna 2) from the seed
    it was built with and the study's size: reproducible, and a resumed study does not replay its draws."""
    if not study_size:
        return
    for part in (sampler, getattr(sampler, "_random_sampler", None)):
        rng = getattr(part, "_rng", None)
        if isinstance(rng, np.random.RandomState):
            rng.seed((int(rng.randint(2**31 - 1)) + study_size) % 2**32)


class NoTrialCompleted(CompactHydraException):
    """Every trial of the study failed: there is no best one (Hydra prints only this line)."""


class RecordingLauncher:
    """The sweeper's launcher: runs the batch's new layouts, records each returned job on the trial it
    ran, and answers a repeated layout from the study."""

    def __init__(self, launcher, sweeper: "RecordingOptunaSweeper") -> None:
        self.launcher, self.sweeper = launcher, sweeper

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        earlier = [tried_before(trial) for trial in self.sweeper.batch]
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
        reseed(self.sampler, stored_trials(self.storage, self.study_name))
        try:
            return super().sweep(arguments)
        except ValueError as e:  # optuna 2's study.best_trial, read at the end, when no trial completed
            if "Record does not exist" not in str(e) and "No trials are completed" not in str(e):
                raise
            raise NoTrialCompleted(f"error: no trial of study {self.study_name} completed; each failed trial's "
                                   "reason is its user attribute fail_reason") from None

    def _configure_trials(self, trials, search_space, fixed_params):
        """Each trial's job overrides. A trial repeating a tried layout is told that trial's outcome and,
        in `trials` itself (the list the sweeper tells after the launch), replaced by an untried layout."""
        jobs = []
        for i, trial in enumerate(trials):
            [job] = super()._configure_trials([trial], search_space, fixed_params)
            earlier = tried_before(trial)
            point = untried(trial.study, search_space) if earlier is not None else None
            if point is not None:
                mark_repeat(trial, earlier)
                trial.set_user_attr("replaced", True)
                trial.study.tell(trial, values=earlier.values, state=earlier.state)
                trial.study.enqueue_trial(point)
                trials[i] = trial = trial.study.ask()
                [job] = super()._configure_trials([trial], search_space, fixed_params)
            jobs.append(expand_mesh(list(job)))
        self.batch = list(trials)  # the batch the next launch runs, in the order of its jobs
        return jobs
