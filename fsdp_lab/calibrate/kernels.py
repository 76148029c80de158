"""What a device table's kernel sections are measured by, on the device: matmul and attention
throughput by shape, memory bandwidth by size (each timed in bursts of back-to-back calls: steady
throughput), the optimizer's step per parameter, NCCL collectives by message size, and a block's
elementwise time eager and compiled (elementwise.py). benchmarks/calibrate_device.py runs them."""

from __future__ import annotations

import json
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from fsdp_lab.calibrate.elementwise import measure_blocks

MATMULS = [  # (M, N, K): tokens x out x in, the shapes of a Llama block's projections and their gradients
    (m, n, k) for m in (2048, 8192, 32768) for n, k in ((2048, 2048), (5632, 2048), (2048, 5632), (32000, 2048), (1024, 2048), (2816, 2048), (4096, 4096))
] + [(512, 2048, 2048), (2048, 2048, 8192), (2048, 2048, 32768)]
ATTENTION = [(b, h, s, d) for b, s in ((1, 1024), (4, 1024), (1, 2048), (4, 2048), (2, 4096)) for h, d in ((16, 128), (8, 128), (32, 64))]
BANDWIDTH_MIB = (1, 8, 64, 512)
# Parameters the optimizer's step is timed over: a Llama block's tensors (dim 2048, ffn 5632) x 8, 0.41B
# (1.6 GB of float32 each for parameters, gradients and both moments): long enough on the GPU that a
# burst's launches stay ahead of it.
OPTIMIZER_PARAMS = {False: (2048 * 2048, 2048 * 2048, 2048 * 2048, 2048 * 2048, 5632 * 2048, 5632 * 2048, 5632 * 2048, 2048, 2048) * 8,
                    True: (4096, 1024, 64) * 2}
COLLECTIVE_MIB = (1, 8, 64, 256)
BURST = 20  # calls per timed burst
SLEEP_CYCLES = 20_000_000  # ~10 ms of GPU clock ahead of a burst: longer than the host takes to queue it
# Blocks whose elementwise work is timed eager and compiled (fsdp_lab/calibrate/elementwise.py): a Llama block
# at two widths, bf16, 4 x 2048 tokens.
COMPILED_BLOCKS = [{"dim": d, "n_heads": h, "ffn_dim": f, "batch": 4, "seq": 2048} for d, h, f in ((1024, 8, 2816), (2048, 16, 5632))]


def timed(fn, iters: int, device: torch.device) -> float:
    """Median seconds of one call of fn over `iters` bursts of BURST back-to-back calls: the steady
    throughput a training step sees, not one launch from an idle GPU. On a GPU each burst is queued
    behind a sleep kernel, so the events around it time the GPU's work alone, not the host's launches."""
    fn()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(SLEEP_CYCLES)
            start.record()
            for _ in range(BURST):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / BURST)
        else:
            t = time.perf_counter()
            for _ in range(BURST):
                fn()
            times.append((time.perf_counter() - t) / BURST)
    return sorted(times)[len(times) // 2]


def matmuls(device, dtype, shapes, iters):
    rows = []
    for m, n, k in shapes:
        a, b = torch.randn(m, k, device=device, dtype=dtype), torch.randn(k, n, device=device, dtype=dtype)
        s = timed(lambda: a @ b, iters, device)
        rows.append({"m": m, "n": n, "k": k, "s": s, "tflops": 2 * m * n * k / s / 1e12})
        del a, b
    return rows


def attention(device, dtype, shapes, iters):
    rows = []
    for b, h, s, d in shapes:
        q, k, v = (torch.randn(b, h, s, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
        fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), iters, device)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        grad = torch.randn_like(out)
        bwd = timed(lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True), iters, device)
        flops = 4 * b * h * s * s * d / 2  # causal: half the score matrix
        rows.append({"b": b, "h": h, "s": s, "d": d, "fwd_s": fwd, "bwd_s": bwd,
                     "fwd_tflops": flops / fwd / 1e12, "bwd_tflops": 2.5 * flops / bwd / 1e12})
    return rows


def bandwidth(device, sizes_mib, iters):
    """Bytes moved (read + write) per second by a copy and by a binary elementwise op, by tensor size."""
    rows = []
    for mib in sizes_mib:
        x = torch.empty(mib * 2**18, device=device)
        y, z = torch.empty_like(x), torch.empty_like(x)
        copy = timed(lambda: y.copy_(x), iters, device)
        add = timed(lambda: torch.add(x, y, out=z), iters, device)
        rows.append({"mib": mib, "copy_gbps": 2 * x.nbytes / copy / 1e9, "add_gbps": 3 * x.nbytes / add / 1e9})
    return rows


def optimizer_step(device, sizes: tuple[int, ...], iters: int) -> dict:
    """Seconds per parameter of the optimizer's step as the trainer takes it: the gradient norm, then
    fused AdamW (on CUDA; foreach elsewhere) over float32 parameters of these sizes, unclipped (the
    plan adds clipping's pass over the gradients by its bytes, fsdp_lab.plan.cost.CLIP_BYTES_PER_PARAM).
    Its multi-tensor kernels run below a copy's bandwidth, so the bytes they move would price them short."""
    from torch import nn

    from fsdp_lab.config import OptimConfig
    from fsdp_lab.optim import Optimization

    params = nn.ParameterList(nn.Parameter(torch.zeros(n, device=device)) for n in sizes)
    for p in params:
        p.grad = torch.randn_like(p)
    optim = Optimization.build(params, OptimConfig(), total_steps=1, device=device)  # the lab's default: AdamW

    def step():
        optim.clip()  # the trainer's gradient norm (no optim.max_norm: nothing clipped)
        optim.optimizer.step()

    s = timed(step, iters, device)
    return {"params": sum(sizes), "tensors": len(sizes), "s": s, "s_per_param": s / sum(sizes)}


def collectives(device, world: int, sizes_mib, iters):
    """Seconds per all-gather / reduce-scatter / all-reduce of an output of each size over every rank."""
    rows = []
    for mib in sizes_mib:
        full = torch.empty(mib * 2**19, device=device, dtype=torch.bfloat16)
        shard = torch.empty(full.numel() // world, device=device, dtype=torch.bfloat16)
        row = {"mib": mib, "group": world}
        row["all_gather_s"] = timed(lambda: dist.all_gather_into_tensor(full, shard), iters, device)
        row["reduce_scatter_s"] = timed(lambda: dist.reduce_scatter_tensor(shard, full), iters, device)
        row["all_reduce_s"] = timed(lambda: dist.all_reduce(full), iters, device)
        rows.append(row)
    return rows


def elementwise_blocks(device, quick: bool) -> list[dict]:
    """A block's elementwise time eager and compiled, on rank 0's GPU (none: not measured)."""
    shapes = [{"dim": 64, "n_heads": 2, "ffn_dim": 128, "batch": 1, "seq": 32}] if quick else COMPILED_BLOCKS
    try:
        rows = measure_blocks(shapes, device, torch.bfloat16 if device.type == "cuda" else torch.float32, calls=3 if quick else 10)
    except Exception as e:  # noqa: BLE001 - without a profiler the rest of the table still counts (the cost model falls back)
        print(f"block elementwise time not measured: {type(e).__name__}: {e}", flush=True)
        return []
    print(json.dumps({"elementwise_blocks": rows}), flush=True)
    return rows


def measure_kernels(table: dict, device, rank: int, world: int, quick: bool) -> None:
    """Matmul, attention and bandwidth on rank 0's GPU; the collectives over every rank."""
    iters = 3 if quick else 5  # bursts: each times BURST calls
    mm_shapes = [(64, 32, 48), (128, 64, 64)] if quick else MATMULS
    attn_shapes = [(1, 2, 32, 16)] if quick else ATTENTION
    bw_sizes = (1,) if quick else BANDWIDTH_MIB
    if rank == 0:  # compute alone on one GPU: the others wait at the barrier, off the GPU's clock
        t0 = time.perf_counter()
        table["matmul"] = {"bfloat16": matmuls(device, torch.bfloat16, mm_shapes, iters),
                           "float32": matmuls(device, torch.float32, mm_shapes[::4], iters)}
        table["attention"] = {"bfloat16": attention(device, torch.bfloat16, attn_shapes, iters)}
        table["bandwidth"] = bandwidth(device, bw_sizes, iters)
        table["optimizer"] = optimizer_step(device, OPTIMIZER_PARAMS[quick], iters)
        if device.type == "cuda":
            table["memory_gib"] = torch.cuda.get_device_properties(device).total_memory / 2**30
        print(f"compute measured in {time.perf_counter() - t0:.1f}s", flush=True)
    dist.barrier()
    measure_collectives(table, device, world, quick)


def measure_collectives(table: dict, device, world: int, quick: bool) -> None:
    """The collectives over every rank, in place of the table's rows of this group size; rows of
    other sizes (an earlier calibration on another GPU count) are kept."""
    if world == 1:
        return
    section = table.setdefault("collectives", {})
    kept = [r for r in section.get("intra_node", []) if r["group"] != world]
    measured = collectives(device, world, (1, 2) if quick else COLLECTIVE_MIB, 3 if quick else 5)
    section["intra_node"] = sorted(kept + measured, key=lambda r: (r["group"], r["mib"]))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    section.setdefault("measured_on", {})[str(world)] = f"{name} x{world}, torch {torch.__version__}"
