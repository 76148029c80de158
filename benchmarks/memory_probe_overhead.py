"""What the per-phase memory probe costs on GPU: the host time of one step's readings (six phase
marks and the step's metrics), and the median step time of a real run with the probe on and off.

    python benchmarks/memory_probe_overhead.py [overrides...]"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
from fsdp_lab.probes.memory import PHASES, PhaseMemory  # noqa: E402
from lab import run_lab  # noqa: E402

REPEATS = 2000
RUN = ("train.steps=30", "probes.parity.enabled=false", "logger=none", "model.dim=1024", "model.n_layers=8",
       "model.n_heads=16", "model.ffn_dim=2816", "train.seq_len=512")


def readings_cost_us(device: torch.device) -> float:
    model = torch.nn.Linear(8, 8, device=device)
    probe = PhaseMemory(device, model, torch.optim.SGD(model.parameters()))
    start = time.perf_counter()
    for _ in range(REPEATS):
        with probe.step():
            for phase in PHASES:
                probe.mark(phase)
        probe.metrics()
    return (time.perf_counter() - start) / REPEATS * 1e6


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("error: this benchmark measures the CUDA allocator probe: it needs a GPU")
    torch.cuda.init()
    print(f"probe readings: {readings_cost_us(torch.device('cuda', 0)):.1f} us per step (host time, no synchronisation)")
    times = {}
    for enabled in ("true", "false"):
        result = run_lab(*RUN, f"probes.memory.enabled={enabled}", *sys.argv[1:], timeout=1800)
        assert result.returncode == 0, result.stderr[-3000:]
        times[enabled] = result.summary["perf"]["step_time_s"]
    on, off = times["true"], times["false"]
    print(f"median step time: probe on {on * 1e3:.2f} ms, off {off * 1e3:.2f} ms, overhead {(on / off - 1) * 100:+.2f}%")


if __name__ == "__main__":
    main()
