"""What a GPU holds of its burst matmul rate once its power limit bites: a device table's `sustained`
section. The 8B block's bf16 matmuls are timed in bursts (as the table's matmul rows are) and then
issued back to back for seconds on every GPU at once (as a training step runs them), with the SM clock
and power each GPU reports. The sustained rate over the bursts' is `sustained.matmul_fraction`: mode=plan
prices matmuls at the table's burst rates times it (fsdp_lab/plan/device.py). benchmarks/calibrate_device.py
records it; benchmarks/sustained_matmul.py prints it second by second.

Each second's clock and power are read from nvidia-smi when the second ends: the GPU idles while it
answers (tens of milliseconds, outside the timed second), so if anything the fraction comes out a
little high."""

from __future__ import annotations

import subprocess
import time

import torch
import torch.distributed as dist

from fsdp_lab.calibrate.kernels import BURST, matmuls

# A Llama-3-8B block's projections and their gradients at 4096 tokens: (M, N, K).
SHAPES = [(4096, 4096, 4096), (4096, 14336, 4096), (4096, 4096, 14336), (14336, 4096, 4096)]


def held_per_second(device: torch.device, seconds: float) -> list[dict]:
    """Per second: the TFLOP/s of the block's matmuls issued back to back, the SM clock and power."""
    operands = [(torch.randn(m, k, device=device, dtype=torch.bfloat16), torch.randn(k, n, device=device, dtype=torch.bfloat16)) for m, n, k in SHAPES]
    flops_per_round = sum(2 * m * n * k for m, n, k in SHAPES)
    rows, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        start, rounds = time.perf_counter(), 0
        while time.perf_counter() - start < 1.0:
            for a, b in operands:
                a @ b
            rounds += 1
            if rounds % 8 == 0:  # the host stays within 8 rounds (~20 ms) of the GPU; the wait leaves no gap to speak of
                torch.cuda.synchronize(device)
        torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
        rows.append({"tflops": round(rounds * flops_per_round / elapsed / 1e12), **clock_and_power(device.index)})
    return rows


def clock_and_power(index: int) -> dict:
    """The SM clock (MHz) and power draw (W) nvidia-smi reports for GPU `index` now."""
    out = subprocess.run(["nvidia-smi", f"--id={index}", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    mhz, watts = out.split(",")
    return {"sm_mhz": int(mhz), "watts": round(float(watts))}


def power_limits() -> str:
    """nvidia-smi's power limits and top SM clock of every GPU, as it prints them."""
    return subprocess.run(["nvidia-smi", "--query-gpu=index,power.limit,power.default_limit,power.max_limit,clocks.max.sm",
                           "--format=csv"], capture_output=True, text=True).stdout


def measure_sustained(device: torch.device, seconds: float) -> list[dict]:
    """Every rank's bursts (TFLOP/s by shape) and its seconds held back to back, gathered to every rank.
    The ranks start the held phase together (a barrier), so every GPU draws full power at once, as in
    a step."""
    bursts = {f"{m}x{n}x{k}": round(r["tflops"]) for (m, n, k), r in zip(SHAPES, matmuls(device, torch.bfloat16, SHAPES, 10))}
    dist.barrier()
    ranks: list = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, {"bursts": bursts, "seconds": held_per_second(device, seconds)})
    return ranks


def held_over_bursts(rank: dict) -> float:
    """One rank's mean held TFLOP/s over its mean burst TFLOP/s."""
    held = sum(s["tflops"] for s in rank["seconds"]) / len(rank["seconds"])
    return held / (sum(rank["bursts"].values()) / len(rank["bursts"]))


def sustained_section(ranks: list[dict], name: str, seconds: float) -> dict:
    """A device table's `sustained` section from measure_sustained's rows: the ranks' mean fraction (they
    differ by a few thousandths; a step's matmuls run on all of them) and where it came from."""
    def spread(values) -> str:
        return f"{min(values)}-{max(values)}"

    seconds_held = [s for r in ranks for s in r["seconds"]]
    fractions = [round(held_over_bursts(r), 3) for r in ranks]
    return {
        "matmul_fraction": round(sum(fractions) / len(fractions), 3),
        "by_rank": fractions,
        "source": (f"{name} x{len(ranks)} (torch {torch.__version__}, {time.strftime('%Y-%m-%d')}) by benchmarks/calibrate_device.py: "
                   f"the 8B block's four bf16 matmul shapes at 4096 tokens ran {spread([v for r in ranks for v in r['bursts'].values()])} "
                   f"TFLOP/s in bursts of {BURST} calls (as this table's matmul rows are timed) and "
                   f"{spread([s['tflops'] for s in seconds_held])} TFLOP/s back to back for {seconds:g} s on every GPU at once, "
                   f"at {spread([s['sm_mhz'] for s in seconds_held])} MHz and {spread([s['watts'] for s in seconds_held])} W"),
    }
