"""Memory at each phase of a training step, as PyTorch's FSDP memory test records it.

On GPU the figures are the CUDA caching allocator's, allocated and reserved: one host-side read of
its counters per phase (no synchronisation, no flattening of the stats dict). On CPU there is no
allocator to ask, so torch's MemTracker counts the storages of the tensors the measured model
creates and holds; the parity reference runs outside it."""

from __future__ import annotations

import contextlib
import time

import torch
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker

from fsdp_lab.memory_phases import MIB, PHASES

SETTLE_READS = 50


class TotalsTracker(MemTracker):
    """MemTracker without its gradient hooks on parameters, which only sort gradients into their
    category: the totals the phases read count them all the same (every tensor an op creates is
    counted). A frozen parameter or an FSDP1 use_orig_params view (not a leaf) refuses those hooks."""

    def _track_module_params_and_buffers(self, module: nn.Module, install_grad_hooks: bool = True) -> tuple[int, int]:
        return super()._track_module_params_and_buffers(module, install_grad_hooks=False)


def init_cublas_workspace(device: torch.device) -> None:
    """Have cuBLAS allocate its workspaces now, through the caching allocator, as PyTorch's memory
    tracker test does: else step 1's first matmul adds them (tens of MiB) to its phases, and they
    would pass for the optimizer state iteration 1 creates."""
    layer = torch.nn.Linear(64, 64, device=device)
    layer(torch.randn(1, 64, device=device)).sum().backward()


def tracker_total(tracker: MemTracker, device: torch.device, kind: str = "current") -> int:
    """Bytes a (FSDP)MemTracker counts on `device` now (`current`) or at its peak (`peak`)."""
    return tracker.get_tracker_snapshot(kind).get(device, {}).get("Total", 0)


class PhaseMemory:
    def __init__(self, device: torch.device, model: nn.Module, optimizer: torch.optim.Optimizer):
        self.device = device
        self.on_gpu = device.type == "cuda"
        self.readings: dict[str, float] = {}
        self.reserved: dict[str, float] = {}
        self.phase_max: dict[str, float] = {}
        self.peak_mib = 0.0
        self.reserved_peak_mib = 0.0
        self._settled: dict[str, int] = {}
        """On CPU: each phase's settled count, as the step before left it."""
        self._own_tracker: MemTracker | None = None
        self._tracker: MemTracker | None = None
        if self.on_gpu:
            init_cublas_workspace(device)
        else:
            self._own_tracker = TotalsTracker()
            self._own_tracker.track_external(model, optimizer)

    @contextlib.contextmanager
    def step(self, tracker: MemTracker | None = None):
        """Measure one optimizer step; `mark(phase)` records the memory at each phase within it.

        `tracker`: a module tracker the caller has entered around this step. On CPU it counts the
        step in place of the phase tracker: two dispatch modes would see every tensor twice."""
        self.readings, self.reserved = {}, {}
        if self.on_gpu:
            torch.cuda.reset_peak_memory_stats(self.device)
            yield
        elif tracker is not None:
            self._tracker = tracker
            yield
        else:
            self._tracker = self._own_tracker
            with self._own_tracker:
                yield

    def mark(self, phase: str) -> None:
        if self.on_gpu:
            stats = torch.cuda.memory_stats_as_nested_dict(self.device)
            self.readings[phase] = stats["allocated_bytes"]["all"]["current"] / MIB
            self.reserved[phase] = stats["reserved_bytes"]["all"]["current"] / MIB
            return
        self._settled[phase] = self._settled_total(self._settled.get(phase))
        self.readings[phase] = self._settled[phase] / MIB
        if self._tracker is self._own_tracker and phase in ("start", "after_bwd"):
            # A forward follows; MemTracker refuses a root module's second forward (the next
            # microbatch or step) unless its per-module statistics, unused here, are cleared.
            self._tracker.reset_mod_stats()

    def _settled_total(self, before: int | None) -> int:
        """The tracker's count once gloo's worker threads have let go of finished collectives'
        buffers: a thread drops its reference to a work's tensors just after the work completes, so
        a read right after `wait()` may still count them (tens of KiB, now and then: phases_stable
        failed 1 run in 3). A count equal to the phase's settled one at the step before (`before`)
        holds nothing over and is taken at once, so a steady step pays no wait; any other is re-read
        every millisecond until two reads agree (at most SETTLE_READS)."""
        total = tracker_total(self._tracker, self.device)
        if total == before:
            return total
        for _ in range(SETTLE_READS):
            time.sleep(1e-3)
            again = tracker_total(self._tracker, self.device)
            if again == total:
                return total
            total = again
        return total

    def metrics(self) -> dict[str, float]:
        """`memory/<phase>_mib` and `memory/peak_mib` for the last step; on GPU also
        `memory/<phase>_reserved_mib` and `memory/reserved_peak_mib`."""
        out = {f"memory/{phase}_mib": self.readings[phase] for phase in PHASES if phase in self.readings}
        if self.on_gpu:
            stats = torch.cuda.memory_stats_as_nested_dict(self.device)
            peak = stats["allocated_bytes"]["all"]["peak"] / MIB
            out.update({f"memory/{phase}_reserved_mib": self.reserved[phase] for phase in PHASES if phase in self.reserved})
            out["memory/reserved_peak_mib"] = stats["reserved_bytes"]["all"]["peak"] / MIB
            self.reserved_peak_mib = max(self.reserved_peak_mib, out["memory/reserved_peak_mib"])
        else:
            peak = tracker_total(self._tracker, self.device, "peak") / MIB
        out["memory/peak_mib"] = max(peak, *self.readings.values())
        self.peak_mib = max(self.peak_mib, out["memory/peak_mib"])
        for phase, value in self.readings.items():
            self.phase_max[phase] = max(self.phase_max.get(phase, 0.0), value)
        return out

    def summary(self) -> dict:
        """The run's peak, the last step's phases and each phase's maximum over the steps."""
        out = {
            "peak_mib": self.peak_mib,
            "phases_mib": {p: self.readings[p] for p in PHASES if p in self.readings},
            "phases_max_mib": {p: self.phase_max[p] for p in PHASES if p in self.phase_max},
        }
        if self.on_gpu:
            out["reserved_peak_mib"] = self.reserved_peak_mib
        return out
