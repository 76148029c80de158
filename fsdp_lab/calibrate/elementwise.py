"""A transformer block's elementwise work on the device, eager and compiled, measured by
benchmarks/calibrate_device.py. A block's forward and backward run eager and compiled (as the lab
compiles it: `block.compile()`) under the profiler; each run's device time splits into matmuls and
attention, which the cost model prices by shape and which compile leaves to the same kernels, and
everything else (norms, rotary, activation, residual adds, casts), which the cost model prices by
the bytes it moves at the table's bandwidth. Two figures come of it (plan/cost.py uses both):
`eager_factor`, the eager elementwise time over what the cost model's pricing of the same block's
traced ops says (broadcasting, strided and flipped operands run below the bandwidth of a plain
add), and `compiled_share`, the compiled elementwise time over the eager one."""

from __future__ import annotations

import copy
import statistics

import torch

# The aten ops that run matmul and attention kernels (by profiler name, without "aten::").
MATMUL_OPS = {"mm", "addmm", "bmm", "baddbmm", "_scaled_mm"}
WRAPPER = "calibrated pass"  # each timed call's own record: the parent of kernels launched outside any op


def _heavy(name: str) -> bool:
    op = name.removeprefix("aten::")
    return name.startswith("aten::") and (op in MATMUL_OPS or "attention" in op or "scaled_dot_product" in op)


def device_seconds(fn, calls: int, device: torch.device) -> dict[str, float]:
    """Device seconds per call of fn (after one call to warm it, compiling if it compiles), split into
    matmul and attention ('heavy_s') and the rest ('elementwise_s'), from the profiler's ops as the
    profiler probe reads them (fsdp_lab/probes/profile.py: on a GPU the kernels' time, each kernel
    under the op that launched it; on a CPU, a check of the script, the ops' own time)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from fsdp_lab.probes.profile import op_rows

    cuda = device.type == "cuda"
    fn()
    if cuda:
        torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
        for _ in range(calls):
            with record_function(WRAPPER):
                fn()
        if cuda:
            torch.cuda.synchronize(device)
    heavy = other = 0.0
    for op in op_rows(prof.key_averages(), calls, device.type):
        if op["name"] == WRAPPER and not cuda:  # its own host time: the timing loop's, not the ops'
            continue
        if _heavy(op["name"]):
            heavy += op["self_ms_per_step"]
        else:
            other += op["self_ms_per_step"]
    return {"heavy_s": heavy / 1e3, "elementwise_s": other / 1e3}


def block_pass(block: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor, compiled: bool = False):
    """One forward and backward of a block, as a training step runs it (input and weight gradients;
    the rotary tables the model gives an eager or a compiled block)."""
    from fsdp_lab.models.transformer import RotaryTables

    cos, sin = RotaryTables(block.attention.head_dim, broadcast=compiled).for_block(block, *x.shape[:2], x.device, x.dtype)
    params = list(block.parameters())

    def run():
        out = block(x, cos, sin)
        torch.autograd.grad(out, [x, *params], grad)

    return run


def measure_blocks(shapes: list[dict], device: torch.device, dtype: torch.dtype, calls: int) -> list[dict]:
    """Each shape's block ({dim, n_heads, ffn_dim, batch, seq}) eager and compiled: device seconds
    of its matmuls and attention and of the rest, per forward and backward."""
    from fsdp_lab.models.transformer import TransformerBlock

    rows = []
    for s in shapes:
        torch.manual_seed(0)
        block = TransformerBlock(s["dim"], s["n_heads"], s["ffn_dim"], 1e-5).to(device=device, dtype=dtype)
        x = torch.randn(s["batch"], s["seq"], s["dim"], device=device, dtype=dtype, requires_grad=True)
        grad = torch.randn_like(x)
        compiled = copy.deepcopy(block)
        compiled.compile()
        eager = device_seconds(block_pass(block, x, grad), calls, device)
        fused = device_seconds(block_pass(compiled, x, grad, compiled=True), calls, device)
        rows.append({**s, **{f"eager_{k}": v for k, v in eager.items()}, **{f"compiled_{k}": v for k, v in fused.items()}})
        del block, compiled, x, grad
    return rows


def priced_block_elementwise_s(shape: dict, device) -> float:
    """What the cost model prices one block's elementwise ops at (forward and backward, bf16, at the
    shape's batch), from the plan's own trace of a 2-block model of that width."""
    from fsdp_lab.plan.predict import Predictor, run_of

    run = run_of(["model.n_layers=2", f"model.dim={shape['dim']}", f"model.n_heads={shape['n_heads']}", f"model.ffn_dim={shape['ffn_dim']}",
                   "model.vocab_size=512", f"train.seq_len={shape['seq']}", "fsdp.param_dtype=bfloat16", "fsdp.reduce_dtype=float32"])
    block, _ = Predictor(run, device, 8).model("none").parts(shape["batch"], 1, device)
    return block["fwd"].mem + block["bwd"].mem


def fit_elementwise(rows: list[dict], device) -> dict:
    """The table's elementwise section from the measured blocks: each block's eager elementwise
    seconds over the cost model's pricing of it, and its compiled over its eager seconds; the
    means are what the cost model reads; and the torch whose trace priced the blocks."""
    from fsdp_lab.plan.trace import traced_on

    for r in rows:
        r["priced_elementwise_s"] = priced_block_elementwise_s(r, device)
        r["eager_factor"] = r["eager_elementwise_s"] / r["priced_elementwise_s"]
        r["compiled_share"] = r["compiled_elementwise_s"] / r["eager_elementwise_s"]
    return {"eager_factor": statistics.mean(r["eager_factor"] for r in rows),
            "compiled_share": statistics.mean(r["compiled_share"] for r in rows), "blocks": rows, "traced_on": traced_on()}
