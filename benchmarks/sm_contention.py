"""What an NCCL collective running beside a matmul costs the matmul, and what leaving SMs to the
collective (cuBLAS's SM carveout, torch._C._set_sm_carveout_experimental) does about it:

    torchrun --nproc-per-node 2 benchmarks/sm_contention.py [--carveouts 0,8,16,32] [--mib 512] [--symm-mem]

For each carveout, a burst of bf16 matmuls of a Llama-3-8B block's shapes (4096 tokens) is timed
alone and with all-gathers of --mib MiB running on another stream the whole time (FSDP2 gathers the
next unit's parameters on its own stream while the current unit computes). The step's matmul kernels are
persistent (in the 8B profiles a grid of 132 CTAs, one per SM of the H200): where NCCL's kernels hold
SMs, some of their CTAs wait for a second wave.
NCCL's own CTA count is set by its environment (NCCL_MAX_CTAS), before the process starts.
--symm-mem gathers through the all-gather fsdp.symm_mem=true installs on a torch without
set_symm_mem_for_comm (fsdp_lab/parallel/symm_mem.py's SymmMemAllGather): into NCCL symmetric memory,
the communicator under the zero-CTA policy, where on one node NCCL may gather with the copy engines and
hold no SMs. On 2xH200 (torch 2.11) the matmuls beside it slowed as much as beside a kernel all-gather
(1.14x against 1.13x, benchmarks/results/sm_contention_symm_mem_2xh200.txt).
Bursts are timed here rather than by fsdp_lab.calibrate.kernels.timed, which puts a sleep kernel ahead
of each burst on the one stream: here the all-gathers are queued ahead of each burst, and the figures
in benchmarks/results/sm_contention_2xh200.txt were taken so."""

from __future__ import annotations

import argparse
import os
from functools import partial

import torch
import torch.distributed as dist

from fsdp_lab.parallel.symm_mem import SymmMemAllGather, use_zero_cta_policy

SHAPES = [(4096, 4096, 4096), (4096, 14336, 4096), (4096, 4096, 14336)]  # (tokens, out, in)
CALLS = 20


def burst_ms(operands, stream) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        start.record()
        for _ in range(CALLS):
            for a, b in operands:
                a @ b
        end.record()
    end.synchronize()
    return start.elapsed_time(end)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--carveouts", default="0,8,16,32")
    p.add_argument("--mib", type=int, default=512)
    p.add_argument("--symm-mem", action="store_true", help="gather into NCCL symmetric memory under the zero-CTA policy")
    a = p.parse_args()
    if a.symm_mem:
        use_zero_cta_policy()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)  # the communicator made now, under the policy set above
    rank, world = dist.get_rank(), dist.get_world_size()
    operands = [(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), torch.randn(k, n, device="cuda", dtype=torch.bfloat16))
                for m, n, k in SHAPES]
    flops = CALLS * sum(2 * m * n * k for m, n, k in SHAPES)
    numel = a.mib * 2**19
    shard = torch.empty(numel // world, device=device, dtype=torch.bfloat16)
    if a.symm_mem:
        symm = SymmMemAllGather()
        full = symm.allocate((numel,), dtype=torch.bfloat16, device=device)
        gather = partial(symm, full, shard, dist.group.WORLD)
    else:
        full = torch.empty(numel, device=device, dtype=torch.bfloat16)
        gather = partial(dist.all_gather_into_tensor, full, shard)
    compute, comm = torch.cuda.Stream(), torch.cuda.Stream()
    for carveout in map(int, a.carveouts.split(",")):
        torch._C._set_sm_carveout_experimental(carveout or None)
        burst_ms(operands, compute)  # warm-up (and cuBLAS's choice of kernel for this carveout)
        alone = sorted(burst_ms(operands, compute) for _ in range(5))[2]
        beside = []
        for _ in range(5):
            torch.cuda.synchronize()
            with torch.cuda.stream(comm):  # gathers queued to outlast the burst
                for _ in range(40):
                    gather()
            beside.append(burst_ms(operands, compute))
            torch.cuda.synchronize()
        beside = sorted(beside)[2]
        if rank == 0:
            print(f"carveout {carveout:3d} SMs: alone {alone:8.2f} ms ({flops / alone / 1e9:5.0f} TFLOPS), beside all-gathers "
                  f"{beside:8.2f} ms ({flops / beside / 1e9:5.0f} TFLOPS), {beside / alone:.2f}x "
                  f"(NCCL_MAX_CTAS={os.environ.get('NCCL_MAX_CTAS', 'default')}{', symmetric memory' if a.symm_mem else ''})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
