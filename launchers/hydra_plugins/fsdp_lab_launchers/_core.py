"""The launchers' heavy half (torch, multiprocessing, the lab's config checks), imported only when a
sweep actually launches so that `--info plugins` and tab completion stay fast.

torchrun: Hydra calls a task function in its own process, but torch elastic installs signal handlers
and must own the main thread of its process, so every sweep job runs in a process of its own
(multiprocessing fork on CPU, spawn on GPUs), which calls Hydra's `run_job` with the job's config and spawns the job's ranks.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Callable, Sequence

import cloudpickle
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobRuntime, JobStatus, run_job, setup_globals
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from fsdp_lab.config import ConfigError
from fsdp_lab.launch_plan import local_job, task_config
from fsdp_lab.spawn import child_start_method

from .sweep_summary import finish_sweep, job_row

JOB_LOG = "logs/job.out"
JOB_RETURN = "logs/job_return.pkl"  # the task function's return value, from the job's process
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


@dataclass
class Job:
    num: int
    overrides: list[str]
    config: DictConfig
    run_dir: Path
    world_size: int
    device_type: str
    gpus: list[str] = field(default_factory=list)
    process: mp.process.BaseProcess | None = None
    started: float = 0.0
    refused: str | None = None
    """The lab's pre-spawn refusal of this job (a sampling sweeper's point): it never starts."""
    returned: Any = None


def job_config(launcher, overrides: list[str], num: int, sweep_dir: Path) -> DictConfig:
    """The job's full config, its sweep dir a literal so no process resolves a second run id."""
    config = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, overrides)
    with open_dict(config):
        config.hydra.job.id = f"{os.getpid()}_{num}"
        config.hydra.job.num = num
        config.hydra.sweep.dir = str(sweep_dir)
    return config


def refuse(launcher, job: Job, error: ConfigError) -> None:
    """A job the lab's checks refuse. In a grid the user wrote (Hydra's basic sweeper) one bad job refuses
    the sweep (exit 2), as for a run; a sweeper that picks its own points (Optuna) gets the job back as
    failed, with the one-line reason, and goes on."""
    if str(launcher.config.hydra.sweeper._target_) == BASIC_SWEEPER:
        print(f"error: {error} (job {job.num}: {' '.join(job.overrides)})", file=sys.stderr, flush=True)
        sys.exit(2)
    job.refused = str(error)
    print(f"[sweep] job {job.num} refused: {error} ({' '.join(job.overrides)})", flush=True)


def plan_jobs(launcher, job_overrides: Sequence[Sequence[str]], initial_job_idx: int, sweep_dir: Path) -> list[Job]:
    """Every job checked before any starts."""
    extra = [] if launcher.max_restarts is None else [f"launch.max_restarts={launcher.max_restarts}"]
    jobs = []
    for i, overrides in enumerate(job_overrides):
        num, overrides = initial_job_idx + i, list(overrides) + extra
        config = job_config(launcher, overrides, num, sweep_dir)
        job = Job(num, overrides, config, sweep_dir / str(config.hydra.sweep.subdir), 0, "cpu")
        try:
            job.world_size, job.device_type = local_job(config)
        except ConfigError as e:
            refuse(launcher, job, e)
        jobs.append(job)
    return jobs


def visible_gpus() -> list[str]:
    import torch

    if os.environ.get("CUDA_VISIBLE_DEVICES"):
        return [g for g in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if g][: torch.cuda.device_count()]
    return [str(i) for i in range(torch.cuda.device_count())]


class Packer:
    """First fit, in sweep order: a GPU job takes `world_size` free GPUs, a CPU job `world_size` of
    `max_ranks`. A CPU job larger than max_ranks still runs, alone. Without packing, one job at a time."""

    def __init__(self, *, pack: bool, max_ranks: int):
        self.pack, self.free_ranks, self.free_gpus = pack, max_ranks, visible_gpus()
        self.running: list[Job] = []

    def fits(self, job: Job) -> bool:
        if not self.running:
            return True
        if not self.pack:
            return False
        if job.device_type == "cuda":
            return job.world_size <= len(self.free_gpus)
        return job.world_size <= self.free_ranks

    def take(self, job: Job) -> None:
        if job.device_type == "cuda":
            job.gpus, self.free_gpus = self.free_gpus[: job.world_size], self.free_gpus[job.world_size :]
        else:
            self.free_ranks -= job.world_size
        self.running.append(job)

    def release(self, job: Job) -> None:
        self.free_gpus += job.gpus
        if job.device_type != "cuda":
            self.free_ranks += job.world_size
        self.running.remove(job)


def job_env(job: Job, *, threads: int | None) -> dict[str, str]:
    env = {}
    if job.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(job.gpus)
    if threads and "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def start(launcher, job: Job, env: dict[str, str]) -> None:
    payload = cloudpickle.dumps((launcher.hydra_context, launcher.task_function, job.config, Singleton.get_state()))
    log = job.run_dir / JOB_LOG
    log.parent.mkdir(parents=True, exist_ok=True)
    (job.run_dir / JOB_RETURN).unlink(missing_ok=True)  # a rerun job dir's: not this run's value
    method = child_start_method(job.device_type)  # CPU jobs fork, GPU jobs spawn
    job.process = mp.get_context(method).Process(target=job_process_main, args=(payload, str(job.run_dir), env), name=f"job{job.num}")
    job.started = time.perf_counter()
    job.process.start()
    where = f"GPUs {','.join(job.gpus)}" if job.gpus else job.device_type
    print(f"[sweep] job {job.num} started: {' '.join(job.overrides)} ({job.world_size} ranks, {where})", flush=True)


def job_process_main(payload: bytes, run_dir: str, env: dict[str, str]) -> None:
    """A job's own process: its output goes to the job's log, then Hydra's run_job calls the task,
    whose return value goes to JOB_RETURN for the launcher's JobReturn."""
    with open(Path(run_dir) / JOB_LOG, "ab", buffering=0) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    os.environ.update(env)
    hydra_context, task_function, config, singleton_state = cloudpickle.loads(payload)
    Singleton.set_state(singleton_state)
    setup_globals()
    ret = run_job(hydra_context=hydra_context, task_function=task_function, config=config,
                  job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
    if ret.status != JobStatus.COMPLETED:
        print(f"error: {type(ret._return_value).__name__}: {ret._return_value}", file=sys.stderr, flush=True)
        sys.exit(1)
    (Path(run_dir) / JOB_RETURN).write_bytes(cloudpickle.dumps(ret.return_value))


def read_job_return(job: Job) -> Any:
    path = job.run_dir / JOB_RETURN
    return cloudpickle.loads(path.read_bytes()) if path.exists() else None


def job_return(job: Job, status: JobStatus) -> JobReturn:
    ret = JobReturn(overrides=job.overrides, cfg=task_config(job.config), hydra_cfg=OmegaConf.create({"hydra": job.config.hydra}),
                    working_dir=os.getcwd(), task_name=JobRuntime.instance().get("name"), status=status)
    ret.return_value = job.returned
    return ret


def refused_row(job: Job) -> dict:
    return job_row(job.num, job.overrides, job.run_dir, exited_ok=False, fallback_error=f"refused: {job.refused}", wall_s=0.0)


def launch_torchrun(launcher, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[JobReturn]:
    sweep_dir = Path(str(launcher.config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    jobs = plan_jobs(launcher, job_overrides, initial_job_idx, sweep_dir)
    max_ranks = launcher.max_ranks or os.cpu_count() or 1
    packer = Packer(pack=launcher.pack, max_ranks=max_ranks)
    threads = max(1, (os.cpu_count() or 1) // max_ranks) if launcher.pack else None
    print(f"[sweep] {len(jobs)} jobs in {sweep_dir} (packing {'on' if launcher.pack else 'off'}, "
          f"{max_ranks} CPU ranks, {len(packer.free_gpus)} GPUs)", flush=True)
    pending = [job for job in jobs if job.refused is None]
    rows = {job.num: refused_row(job) for job in jobs if job.refused is not None}
    while pending or packer.running:
        for job in list(pending):
            if packer.fits(job):
                pending.remove(job)
                packer.take(job)
                start(launcher, job, job_env(job, threads=threads))
            elif not launcher.pack:
                break
        done = wait([job.process.sentinel for job in packer.running])
        for job in [j for j in packer.running if j.process.sentinel in done]:
            job.process.join()
            packer.release(job)
            code = job.process.exitcode
            job.returned = read_job_return(job)
            row = job_row(job.num, job.overrides, job.run_dir, exited_ok=code == 0,
                          fallback_error=f"job process exited with code {code}, see {job.run_dir / JOB_LOG}",
                          wall_s=time.perf_counter() - job.started)
            rows[job.num] = row
            outcome = "ok" if row["status"] == "ok" else f"FAILED: {row['error']}"
            print(f"[sweep] job {job.num} {outcome} ({row['wall_s']:.1f} s, run dir: {job.run_dir})", flush=True)
    ordered = [rows[job.num] for job in jobs]
    returns = [job_return(job, JobStatus.UNKNOWN) for job in jobs]
    finish_sweep(sweep_dir, ordered, returns, first_job=initial_job_idx)
    return returns



def pin_sweep_dir(config: DictConfig, sweep_dir: Path) -> None:
    """Every SLURM task (and every requeue) composes its config again: pass it the parent's sweep dir
    as an override, or each would resolve a run id of its own."""
    with read_write(config), open_dict(config):
        config.hydra.sweep.dir = str(sweep_dir)
        config.hydra.overrides.hydra.append(f"hydra.sweep.dir={sweep_dir}")


def launch_slurm(launcher, base_launch, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[JobReturn]:
    """Jobs are checked, then submitted by the base launcher: one array per run of consecutive jobs
    with the same world size, since tasks_per_node is a property of the whole array. A refused job
    (under a sampling sweeper) is not submitted."""
    from fsdp_lab.launch_plan import cluster_world_size

    sweep_dir = Path(str(launcher.config.hydra.sweep.dir)).resolve()
    pin_sweep_dir(launcher.config, sweep_dir)
    nodes, gpus = launcher.params["nodes"], launcher.params.get("gpus_per_node")
    jobs = []
    for i, overrides in enumerate(job_overrides):
        config = job_config(launcher, list(overrides), initial_job_idx + i, sweep_dir)
        job = Job(initial_job_idx + i, list(overrides), config, sweep_dir / str(config.hydra.sweep.subdir), 0, "slurm")
        try:
            job.world_size = launcher.world_size or cluster_world_size(config, gpus_per_node=gpus, nodes=nodes)
            if job.world_size % nodes:
                raise ConfigError(f"hydra.launcher.nodes={nodes}: must divide the job's world size {job.world_size}")
        except ConfigError as e:
            refuse(launcher, job, e)
        jobs.append(job)
    submitted = [job for job in jobs if job.refused is None]
    returns: dict[int, JobReturn] = {}
    while len(returns) < len(submitted):
        rest = submitted[len(returns):]
        # The base launcher numbers an array's jobs on from its first: an array holds consecutive numbers.
        same = next((n for n, job in enumerate(rest) if job.world_size != rest[0].world_size or job.num != rest[0].num + n), len(rest))
        launcher.params["tasks_per_node"] = rest[0].world_size // nodes
        if gpus:
            launcher.params["gpus_per_node"] = rest[0].world_size // nodes
        group = rest[:same]
        returns.update(zip((job.num for job in group), base_launch([job.overrides for job in group], group[0].num)))
    ordered = [returns.get(job.num) or job_return(job, JobStatus.UNKNOWN) for job in jobs]
    rows = [
        refused_row(job) if job.refused is not None else
        job_row(job.num, job.overrides, job.run_dir, exited_ok=ret.status == JobStatus.COMPLETED,
                fallback_error=f"{ret._return_value!r}; logs: {sweep_dir / '.submitit'}")
        for job, ret in zip(jobs, ordered)
    ]
    finish_sweep(sweep_dir, rows, ordered, first_job=initial_job_idx)
    return ordered


def run_slurm_rank(call: Callable[[], JobReturn]) -> JobReturn:
    """This SLURM task as its rank of the job. SLURM stops a job's tasks with SIGTERM to requeue,
    preempt or cancel it: such a task ends without a result, so that submitit waits for the requeued
    job instead of reporting the stopped one as failed."""
    from fsdp_lab.worker import Terminated

    become_slurm_rank()
    ret = call()
    if ret.status is JobStatus.FAILED and isinstance(ret._return_value, Terminated):
        raise SystemExit(f"stopped by SLURM: {ret._return_value}")
    return ret


def become_slurm_rank() -> None:
    """RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT from this SLURM task's environment, so the
    entry point works as that rank (rank 0 on the first node of the allocation is the master)."""
    import submitit

    env = submitit.JobEnvironment()
    os.environ.update(
        RANK=str(env.global_rank), WORLD_SIZE=str(env.num_tasks), LOCAL_RANK=str(env.local_rank),
        MASTER_ADDR=env.hostnames[0],
        # Deterministic per job, so every task agrees without talking; distinct for jobs sharing a node.
        MASTER_PORT=str(20000 + int(os.environ["SLURM_JOB_ID"]) % 20000),
    )
