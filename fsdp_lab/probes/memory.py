"""Memory at each phase of a training step, as PyTorch's FSDP memory test records it.

On GPU the figures are the CUDA caching allocator's (host-side counters: reading them does not
synchronise). On CPU there is no allocator to ask, so torch's MemTracker counts the storages of the
tensors the measured model creates and holds; the parity reference runs outside it."""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker

PHASES = ("start", "after_fwd", "after_loss", "after_bwd", "after_step", "done")
MIB = 2**20


class PhaseMemory:
    def __init__(self, device: torch.device, model: nn.Module, optimizer: torch.optim.Optimizer):
        self.device = device
        self.readings: dict[str, float] = {}
        self.tracker: MemTracker | None = None
        if device.type != "cuda":
            self.tracker = MemTracker()
            self.tracker.track_external(model, optimizer)

    def _current_bytes(self) -> int:
        if self.tracker is None:
            return torch.cuda.memory_allocated(self.device)
        return self.tracker.get_tracker_snapshot("current").get(self.device, {}).get("Total", 0)

    def _peak_bytes(self) -> int:
        if self.tracker is None:
            return torch.cuda.max_memory_allocated(self.device)
        return self.tracker.get_tracker_snapshot("peak").get(self.device, {}).get("Total", 0)

    @contextlib.contextmanager
    def step(self):
        """Measure one optimizer step; `mark(phase)` records the memory at each phase within it."""
        self.readings = {}
        if self.tracker is None:
            torch.cuda.reset_peak_memory_stats(self.device)
            tracking = contextlib.nullcontext()
        else:
            tracking = self.tracker
        with tracking:
            yield

    def mark(self, phase: str) -> None:
        self.readings[phase] = self._current_bytes() / MIB
        if self.tracker is not None and phase in ("start", "after_bwd"):
            # A forward follows; MemTracker refuses a root module's second forward (the next
            # microbatch or step) unless its per-module statistics, unused here, are cleared.
            self.tracker.reset_mod_stats()

    def metrics(self) -> dict[str, float]:
        """`memory/<phase>_mib` for the last step, and its `memory/peak_mib`."""
        out = {f"memory/{phase}_mib": self.readings[phase] for phase in PHASES if phase in self.readings}
        out["memory/peak_mib"] = max(self._peak_bytes() / MIB, *self.readings.values())
        return out
