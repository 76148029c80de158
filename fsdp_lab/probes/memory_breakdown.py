"""One training step under torch's module-wise memory tracker: FSDPMemTracker for FSDP2 models
(categories: sharded/unsharded params and grads, activations, temporaries, optimizer state,
all-gather and reduce-scatter buffers, inputs), MemTracker for other engines.

The tracker is entered after a warm-up step, so the optimizer state exists and is counted from the
step's start, as PyTorch's MemTracker test resets its statistics after iteration 0. Per module, the
report keeps the peak in forward and in backward with the categories at that moment; on GPU it
compares the tracker's peak with the CUDA allocator's."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.fsdp import FSDPModule

from fsdp_lab.memory_phases import MIB
from fsdp_lab.probes.memory import PhaseMemory, tracker_total
from fsdp_lab.sinks.files import write_json_atomic

BREAKDOWN_JSON = "memory_breakdown.json"
BREAKDOWN_TABLE = "memory_breakdown.md"
PEAK_STATES = {"PEAK_FW": "forward", "PEAK_BW": "backward"}
TABLE_DEPTH = 2  # module rows in the readable table: the root's children and grandchildren


def _mib_by_category(snapshot: dict) -> dict[str, float]:
    return {getattr(k, "value", k): v / MIB for k, v in snapshot.items() if k != "Total"}


class ModuleBreakdown:
    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device, *, step: int, gather: bool):
        self.model, self.optimizer, self.device = model, optimizer, device
        self.step = step
        """The 1-based optimizer step to track."""
        self.gather = gather
        """Collect every rank's peak (real runs); a fake process group cannot."""
        self.tracker: MemTracker | None = None
        self.report: dict | None = None
        self._modules: dict[str, dict[str, dict]] = {}
        self._microbatches = 0

    def _new_tracker(self, batches) -> MemTracker:
        if isinstance(self.model, FSDPModule):
            tracker = FSDPMemTracker(self.model, self.optimizer)
            tracker.track_inputs(batches)
        else:
            tracker = MemTracker()
            tracker.track_external(self.model, self.optimizer, batches)
        return tracker

    @contextlib.contextmanager
    def track(self, batches):
        """Run the step inside, calling `mark(phase)` at the step's phase points."""
        self.tracker = tracker = self._new_tracker(batches)
        on_gpu = self.device.type == "cuda"
        with tracker:
            untracked = None
            if on_gpu:
                torch.cuda.reset_peak_memory_stats(self.device)
                # Resident memory the tracker does not own: the parity reference, cuBLAS workspace.
                untracked = torch.cuda.memory_allocated(self.device) - tracker_total(tracker, self.device)
            yield
            self._harvest()
        allocator_peak = torch.cuda.max_memory_allocated(self.device) if on_gpu else None
        self.report = self._build_report(allocator_peak, untracked)
        self.tracker = None

    def mark(self, phase: str) -> None:
        if phase == "after_bwd":
            # The next microbatch's forward would be refused as a second iteration: keep this
            # microbatch's per-module peaks, then clear the tracker's.
            self._harvest()
            self.tracker.reset_mod_stats()

    def _harvest(self) -> None:
        if not self.tracker.memory_tracking:
            return
        self._microbatches += 1
        for stats in self.tracker.memory_tracking.values():
            entry = self._modules.setdefault(stats.mod_fqn, {})
            for state, snapshots in stats.snapshots.items():
                phase = PEAK_STATES.get(state.name)
                if phase is None:
                    continue
                for snapshot in snapshots:
                    on_device = snapshot.get(self.device, {})
                    total = on_device.get("Total", 0) / MIB
                    if total > entry.get(phase, {}).get("peak_mib", -1.0):
                        entry[phase] = {"peak_mib": total, "categories_mib": _mib_by_category(on_device)}

    def _build_report(self, allocator_peak: int | None, untracked: int | None) -> dict:
        peak = self.tracker.get_tracker_snapshot("peak").get(self.device, {"Total": 0})
        mine = {"peak_mib": peak["Total"] / MIB, "peak_categories_mib": _mib_by_category(peak)}
        ranks = [mine]
        if self.gather and dist.is_initialized():
            ranks = [None] * dist.get_world_size()
            theirs = {**mine, "allocator_peak_mib": None if allocator_peak is None else allocator_peak / MIB}
            dist.all_gather_object(ranks, theirs)
        accuracy = None
        if allocator_peak is not None:
            accuracy = peak["Total"] / max(allocator_peak - untracked, 1)
        return {
            "tracker": type(self.tracker).__name__,
            "step": self.step,
            "microbatches": self._microbatches,
            "device": self.device.type,
            **mine,
            "allocator_peak_mib": None if allocator_peak is None else allocator_peak / MIB,
            "untracked_mib": None if untracked is None else untracked / MIB,
            "tracker_accuracy": accuracy,
            "ranks": [{"rank": r, **stats} for r, stats in enumerate(ranks)],
            "modules": [{"module": fqn, **phases} for fqn, phases in self._modules.items()],
        }


@contextlib.contextmanager
def measured(memory: PhaseMemory, breakdown: ModuleBreakdown, batches):
    """Both around one step outside a training run (mode=estimate); yields the phase marker. The
    tracker is entered first: on CPU the phases are read from it."""
    with breakdown.track(batches), memory.step(breakdown.tracker):

        def mark(phase: str) -> None:
            breakdown.mark(phase)
            memory.mark(phase)

        yield mark


def categories(report: dict) -> list[str]:
    """Categories that hold memory somewhere in the report, in the tracker's order."""
    snapshots = [report["peak_categories_mib"]]
    snapshots += [m[phase]["categories_mib"] for m in report["modules"] for phase in ("forward", "backward") if phase in m]
    names = dict.fromkeys(name for snapshot in snapshots for name in snapshot)
    return [name for name in names if any(snapshot.get(name, 0) > 0 for snapshot in snapshots)]


def table_rows(report: dict) -> tuple[list[str], list[list]]:
    """(columns, rows): one row per module and phase, then the step's peak; MiB."""
    cats = categories(report)
    rows = []
    for module in report["modules"]:
        for phase in ("forward", "backward"):
            if phase in module:
                p = module[phase]
                rows.append([module["module"], phase, p["peak_mib"], *(p["categories_mib"].get(c, 0.0) for c in cats)])
    rows.append(["(step peak)", "", report["peak_mib"], *(report["peak_categories_mib"].get(c, 0.0) for c in cats)])
    return ["module", "phase", "peak_mib", *cats], rows


def render_table(report: dict, title: str) -> str:
    """A Markdown table of the per-module peaks (modules up to TABLE_DEPTH below the root)."""
    columns, rows = table_rows(report)
    rows = [r for r in rows if r[0].count(".") <= TABLE_DEPTH]
    lines = [f"# {title}", ""]
    accuracy = report.get("tracker_accuracy")
    lines.append(
        f"{report['tracker']}, step {report['step']}, peak {report['peak_mib']:.2f} MiB"
        + (f", allocator peak {report['allocator_peak_mib']:.2f} MiB (less {report['untracked_mib']:.2f} MiB "
           f"resident outside the tracker), tracker/allocator {accuracy:.3f}" if accuracy is not None else "")
    )
    if len(report.get("ranks", ())) > 1:
        lines.append("peak per rank (MiB): " + ", ".join(f"{r['rank']}: {r['peak_mib']:.2f}" for r in report["ranks"]))
    lines += ["", "MiB per category at each module's peak", ""]
    lines.append("| " + " | ".join(columns) + " |")
    lines.append("|" + "---|" * len(columns))
    for row in rows:
        cells = [row[0], row[1], *(f"{v:.2f}" for v in row[2:])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_breakdown(run_dir: Path, report: dict) -> None:
    write_json_atomic(run_dir / BREAKDOWN_JSON, report)
    (run_dir / BREAKDOWN_TABLE).write_text(render_table(report, f"Memory breakdown of step {report['step']}, rank 0"))
