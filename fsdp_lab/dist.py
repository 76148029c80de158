"""Process group, device and backend choice, determinism."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from fsdp_lab.config import ConfigError

RANK_ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
# Set by the lab's own launch (fsdp_lab/spawn.py), whose ranks share this machine: a directory where
# the ranks of each attempt meet on a FileStore. Ranks started by torchrun or srun meet at MASTER_ADDR.
RANK_STORE_DIR = "FSDP_LAB_RANK_STORE_DIR"


def is_rank_process() -> bool:
    """True when a launcher (torchrun, torch elastic, srun setup) already made this process a rank."""
    return all(k in os.environ for k in RANK_ENV_KEYS)


def resolve_device_type(device: str) -> str:
    """`auto` -> cuda when GPUs are visible, else cpu; `cuda` without GPUs is a user error."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda: no CUDA GPU is visible to this process; allowed here: auto, cpu")
    return device


def default_world_size(device_type: str, cpu_ranks: int) -> int:
    """One rank per GPU, or `cpu_ranks` on CPU."""
    return torch.cuda.device_count() if device_type == "cuda" else cpu_ranks


@dataclass(frozen=True)
class DistContext:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def rank_store(world: int) -> dist.Store | None:
    """The lab's launch: a FileStore of this attempt (a restarted attempt meets on a new file, never
    on what a killed one left); None: env:// at MASTER_ADDR:MASTER_PORT, as torchrun and srun set them."""
    store_dir = os.environ.get(RANK_STORE_DIR)
    if not store_dir:
        return None
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.FileStore(os.path.join(store_dir, f"attempt-{attempt}"), world)


def init_distributed(device_type: str, timeout_s: int) -> DistContext:
    """Join the process group of the ranks the launcher started (rank_store)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    if device_type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(
            backend=backend,
            store=rank_store(world),
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=timeout_s),
            device_id=device if device_type == "cuda" else None,
        )
    return DistContext(rank=rank, local_rank=local_rank, world_size=world, device=device)


def close_distributed(failed: bool) -> None:
    """Leave the process group. A failed NCCL rank aborts it instead: destroying it waits for the
    rank's posted operations, and a pipeline rank that ran out of memory mid-step has sends and receives
    its peer never completes, so the rank never exited and the launcher never saw it fail (a 2xH100
    study's pp2 trial hung 5 minutes until killed). gloo's destroy returns."""
    if failed and dist.get_backend() == "nccl":
        dist.distributed_c10d._abort_process_group()
    else:
        dist.destroy_process_group()


def set_determinism(seed: int, deterministic_kernels: bool) -> None:
    """Same seed on every rank so model init is identical; optionally deterministic GPU kernels,
    which cost speed (CPU kernels already repeat bit for bit)."""
    torch.manual_seed(seed)
    if deterministic_kernels:
        torch.use_deterministic_algorithms(True, warn_only=True)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
