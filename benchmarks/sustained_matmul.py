"""The 8B block's bf16 matmuls in bursts (as the device table times them) and then sustained for
seconds on every GPU at once (as a training step runs them), with the SM clock and power each GPU
reports: whether a GPU holds its burst rate once its power limit bites.

    torchrun --nproc-per-node 4 benchmarks/sustained_matmul.py [--seconds 15]

Each rank takes its own GPU; the ranks start the sustained phase together (a barrier), so every GPU
draws full power at once, as in a step. Every second each rank prints the TFLOP/s of that second's
matmuls and its GPU's SM clock and power draw as nvidia-smi reports them when the second ends (the
GPU idles while nvidia-smi answers, tens of milliseconds a second, outside the timed second: if
anything the sustained rate comes out a little high). Rank 0 also prints the power limits. The bursts
are fsdp_lab.calibrate.kernels' timed: 20 calls behind a sleep kernel, a few milliseconds each. The
sustained rate over the bursts' is what a device table's `sustained.matmul_fraction` records:
mode=plan prices matmuls at the table's burst rates times it (fsdp_lab/plan/device.py)."""

from __future__ import annotations

import argparse
import os
import subprocess
import time

import torch
import torch.distributed as dist

from fsdp_lab.calibrate.kernels import matmuls

# A Llama-3-8B block's projections and their gradients at 4096 tokens: (M, N, K).
SHAPES = [(4096, 4096, 4096), (4096, 14336, 4096), (4096, 4096, 14336), (14336, 4096, 4096)]


def sustained(device: torch.device, seconds: float) -> list[dict]:
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=15)
    a = p.parse_args()
    rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    if rank == 0:
        print(subprocess.run(["nvidia-smi", "--query-gpu=index,power.limit,power.default_limit,power.max_limit,clocks.max.sm",
                              "--format=csv"], capture_output=True, text=True).stdout, flush=True)
    bursts = {f"{m}x{n}x{k}": round(r["tflops"]) for (m, n, k), r in zip(SHAPES, matmuls(device, torch.bfloat16, SHAPES, 10))}
    dist.barrier()
    rows = sustained(device, a.seconds)
    for r in range(dist.get_world_size()):
        dist.barrier()
        if r == rank:
            print(f"rank {rank} bursts (TFLOP/s): {bursts}", flush=True)
            print(f"rank {rank} sustained, per second: " + ", ".join(f"{x['tflops']} ({x['sm_mhz']} MHz, {x['watts']} W)" for x in rows), flush=True)
            held = sum(x["tflops"] for x in rows) / len(rows) / (sum(bursts.values()) / len(bursts))
            print(f"rank {rank} sustained over bursts: {held:.3f} (a device table's sustained.matmul_fraction)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
