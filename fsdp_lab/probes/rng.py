"""The random stream a step's forward draws from (dropout masks, any other randomness in a model's
forward): the parity reference and a replayed step draw from the same state as the measured step,
so a model with dropout on holds parity wherever the reference runs the same shapes in the same order
(data parallelism: DDP, FSDP, HSDP). Tensor-parallel shards draw other shapes; families refuse those
(fsdp_lab/models/hf.py)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RngState:
    cpu: torch.Tensor
    cuda: torch.Tensor | None
    device: torch.device


def capture(device: torch.device) -> RngState:
    """The global generators' state now: the CPU's, and the device's on CUDA."""
    return RngState(torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None, device)


def restore(state: RngState) -> None:
    torch.set_rng_state(state.cpu)
    if state.cuda is not None:
        torch.cuda.set_rng_state(state.cuda, state.device)


@contextlib.contextmanager
def drawing_from(state: RngState):
    """Run the block from `state`; afterwards the generators are where they were before it."""
    now = capture(state.device)
    restore(state)
    try:
        yield
    finally:
        restore(now)
