"""Step time of one layout from the traced ops and a device table.

Traces of 1 and 2 blocks at 1 and 2 samples give, by difference, what one block and what the rest of
the model cost at any depth and microbatch size. Each op is priced on the device: matmuls and
attention by shape from the measured tables, everything else by the bytes it moves. TP divides the
matmuls and the sharded activations and adds its all-reduces; FSDP's all-gathers and
reduce-scatters run on a comm stream beside the compute, unit by unit, as FSDP2 issues them
(prefetching one unit ahead); PP runs a stage's share of the blocks with the schedule's bubble.
The CPU issues every op: when that takes longer than the GPU's work, the step is host-bound."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fsdp_lab.plan.device import Device
from fsdp_lab.plan.trace import Op, Trace

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
# Without sequence parallelism TP leaves the residual stream and the norms replicated: about this
# share of a block's elementwise traffic (the rest, attention and MLP internals, is split tp ways).
TP_REPLICATED_ELEMENTWISE = 0.4
# torch.compile fuses a block's elementwise chains: about this share of their traffic remains.
COMPILED_ELEMENTWISE = 0.5
# Host ops a compiled block still dispatches per matmul or attention call it holds (graph calls,
# FSDP's hooks, autograd's nodes): the elementwise ops between them are fused away.
COMPILED_HOST_OPS_PER_KERNEL = 2
# Host work per FSDP unit per pass (pre/post hooks, copy-in/out bookkeeping), on top of its ops.
FSDP_UNIT_HOST_OPS = 40
ADAM_BYTES_PER_PARAM = 28  # fused AdamW: reads param, grad, exp_avg, exp_avg_sq; writes three (fp32)


@dataclass(frozen=True)
class Layout:
    pp: int
    dp_replicate: int
    dp_shard: int
    tp: int
    ac: str
    microbatches: int
    microbatch_size: int  # samples per microbatch per dp rank
    reshard: bool
    compile: bool = False

    @property
    def world(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.tp


@dataclass
class Parts:
    """Seconds of GPU work (and host ops) of one pass over some ops."""

    mm: float = 0.0
    attn: float = 0.0
    mem: float = 0.0
    host_ops: float = 0.0
    kernels: int = 0  # matmul and attention calls
    hidden_bytes: float = 0.0  # one activation of the residual stream (tokens x hidden), for TP's all-reduces

    def __sub__(self, o: Parts) -> Parts:
        return Parts(self.mm - o.mm, self.attn - o.attn, self.mem - o.mem, self.host_ops - o.host_ops,
                     self.kernels - o.kernels, self.hidden_bytes)


def _scaled(d1: tuple, d2: tuple, mb: int) -> tuple:
    """Dims at microbatch size mb from those at 1 and 2 samples (the batch dims grow linearly)."""
    return tuple(a + (b - a) * (mb - 1) for a, b in zip(d1, d2))


def _split_tp(d1: tuple, d2: tuple, dims: tuple, tp: int, skip: int = 0) -> tuple:
    """Split the largest dim that does not grow with the batch tp ways (a column- or row-wise shard)."""
    fixed = [i for i in range(skip, len(dims)) if d1[i] == d2[i]]
    if tp == 1 or not fixed:
        return dims
    i = max(fixed, key=lambda j: dims[j])
    return tuple(math.ceil(x / tp) if j == i else x for j, x in enumerate(dims))


def price(one: Trace, two: Trace, mb: int, tp: int, device: Device) -> dict[str, Parts]:
    """GPU seconds per phase (fwd, bwd) of trace `one` (1 sample) scaled to mb samples per microbatch,
    `two` being the same model traced with 2 samples."""
    out = {}
    for phase in ("fwd", "bwd"):
        ops1 = [o for o in one.ops if o.phase == phase]
        ops2 = [o for o in two.ops if o.phase == phase]
        p = Parts(host_ops=one.host_ops[phase])
        heavy1 = [o for o in ops1 if o.kind != "mem"]
        heavy2 = [o for o in ops2 if o.kind != "mem"]
        pairs = zip(heavy1, heavy2) if len(heavy1) == len(heavy2) else ((o, o) for o in heavy1)
        for o1, o2 in pairs:
            dims = _scaled(o1.dims, o2.dims, mb)
            p.kernels += 1
            if o1.kind == "mm":
                m, n, k = _split_tp(o1.dims, o2.dims, dims, tp)
                p.mm += device.matmul_s(m, n, k, o1.dtype)
                if phase == "fwd":  # tokens x the model's width: what TP all-reduces after a row-wise matmul
                    p.hidden_bytes = max(p.hidden_bytes, dims[0] * min(o1.dims[1:]) * DTYPE_BYTES.get(o1.dtype, 4))
            else:
                bh, s, d = dims
                p.attn += device.attention_s(math.ceil(bh / tp), s, d, backward=phase == "bwd")
        bytes1 = sum(o.dims[0] for o in ops1 if o.kind == "mem")
        bytes2 = sum(o.dims[0] for o in ops2 if o.kind == "mem")
        ratio = (bytes1 + (bytes2 - bytes1) * (mb - 1)) / bytes1 if bytes1 else 1.0
        p.mem = sum(device.memory_s(o.dims[0] * ratio) for o in ops1 if o.kind == "mem")
        out[phase] = p
    return out


@dataclass
class Model:
    """What the traces of one AC mode say about the model, ready to price any layout."""

    traces: dict[tuple[int, int], Trace]  # (blocks, samples) -> trace: (1, 1), (2, 1), (2, 2)
    layers: int  # the model's blocks
    block_params: int  # parameters of all blocks
    other_params: int
    param_bytes: int  # bytes per element the all-gathers move (fsdp.param_dtype)
    reduce_bytes: int  # ... and the reduce-scatters (fsdp.reduce_dtype)
    seq_len: int

    def parts(self, mb: int, tp: int, device: Device) -> tuple[dict[str, Parts], dict[str, Parts]]:
        """(one block, the rest of the model) per phase, at microbatch size mb."""
        t = self.traces
        two = price(t[(2, 1)], t[(2, 2)], mb, tp, device)
        one = _price_like(t[(1, 1)], t[(2, 1)], t[(2, 2)], mb, tp, device)
        block = {ph: two[ph] - one[ph] for ph in two}
        rest = {ph: one[ph] - block[ph] for ph in two}
        return block, rest


def _price_like(one: Trace, two1: Trace, two2: Trace, mb: int, tp: int, device: Device) -> dict[str, Parts]:
    """Price the 1-block trace at mb samples, each part growing with the batch as the 2-block trace's
    does (one trace fewer than pairing it with its own 2-sample twin)."""
    full = price(two1, two2, mb, tp, device)
    at_one = price(two1, two1, 1, tp, device)
    single = price(one, one, 1, tp, device)
    out = {}
    for ph in full:
        f, a, s = full[ph], at_one[ph], single[ph]
        grow = lambda x, y: (x / y) if y else 1.0  # noqa: E731
        out[ph] = Parts(s.mm * grow(f.mm, a.mm), s.attn * grow(f.attn, a.attn), s.mem * grow(f.mem, a.mem),
                        s.host_ops, s.kernels, f.hidden_bytes)
    return out


def group_link(layout: Layout, dim: str, gpus_per_node: int) -> tuple[int, bool]:
    """(size, crosses nodes) of a mesh dimension's groups; ranks are laid out pp, dp_replicate, dp_shard, tp."""
    order = ("pp", "dp_replicate", "dp_shard", "tp")
    sizes = {d: getattr(layout, d) for d in order}
    stride = math.prod(sizes[d] for d in order[order.index(dim) + 1 :])
    return sizes[dim], stride * sizes[dim] > gpus_per_node


def step_time(model: Model, layout: Layout, device: Device, gpus_per_node: int) -> dict:
    """Predicted seconds per optimizer step, with its parts."""
    L = model.layers // layout.pp
    block, rest = model.parts(layout.microbatch_size, layout.tp, device)
    tp, shard = layout.tp, layout.dp_shard
    tp_size, tp_inter = group_link(layout, "tp", gpus_per_node)
    sh_size, sh_inter = group_link(layout, "dp_shard", gpus_per_node)
    rep_size, rep_inter = group_link(layout, "dp_replicate", gpus_per_node)
    pp_size, pp_inter = group_link(layout, "pp", gpus_per_node)

    def gpu(p: Parts, in_block: bool) -> float:
        factor = 1.0
        if in_block:
            factor = TP_REPLICATED_ELEMENTWISE + (1 - TP_REPLICATED_ELEMENTWISE) / tp
            factor *= COMPILED_ELEMENTWISE if layout.compile else 1.0
        return p.mm + p.attn + p.mem * factor

    tp_ar = device.collective_s("all_reduce", block["fwd"].hidden_bytes, tp_size, tp_inter) if tp > 1 else 0.0
    fwd_b = gpu(block["fwd"], True) + 2 * tp_ar
    bwd_b = gpu(block["bwd"], True) + 2 * tp_ar
    fwd_r, bwd_r = gpu(rest["fwd"], False) + tp_ar, gpu(rest["bwd"], False) + tp_ar
    unit = model.block_params / model.layers / tp
    root = model.other_params / tp / (layout.pp if layout.pp > 1 else 1)

    def gather(n): return device.collective_s("all_gather", n * model.param_bytes, sh_size, sh_inter) if shard > 1 else 0.0
    def reduce(n):
        t = device.collective_s("reduce_scatter", n * model.reduce_bytes, sh_size, sh_inter) if shard > 1 else 0.0
        return t + device.collective_s("all_reduce", n * model.reduce_bytes / shard, rep_size, rep_inter)

    fwd_gpu, comm = _simulate(L, fwd_b, bwd_b, fwd_r, bwd_r, gather(unit), reduce(unit), gather(root), reduce(root), layout.reshard)
    host = _host_seconds(block, rest, L, layout, device)
    per_mb = max(fwd_gpu, host)
    if layout.pp > 1:
        p2p = device.collective_s("all_gather", 2 * block["fwd"].hidden_bytes, 2, pp_inter)
        step = (layout.microbatches + layout.pp - 1) * (per_mb + 2 * p2p)
    else:
        step = layout.microbatches * per_mb
    local_params = (model.block_params / layout.pp + root * tp) / tp / shard
    optimizer = device.memory_s(local_params * ADAM_BYTES_PER_PARAM)
    return {"step_time_s": step + optimizer, "gpu_s": fwd_gpu, "host_s": host, "comm_s": comm,
            "optimizer_s": optimizer, "host_bound": host > fwd_gpu}


def _simulate(L, fwd_b, bwd_b, fwd_r, bwd_r, ag, rs, ag_root, rs_root, reshard) -> tuple[float, float]:
    """One microbatch's forward and backward on a compute stream and a comm stream: FSDP2 all-gathers
    a unit one ahead of its compute (two in flight at most) and reduce-scatters it after its backward.
    Returns (end time, seconds the comm stream was busy)."""
    comm_free = ag_root
    t = comm_free
    ends = [0.0, 0.0]
    busy = ag_root
    for _ in range(L):  # forward: the rest of the model (output, loss) runs after the blocks
        start = max(comm_free, ends[-2])
        comm_free = start + ag
        busy += ag
        begin = max(t, comm_free)
        t = begin + fwd_b
        ends.append(t)
    t += fwd_r + bwd_r  # output and loss, their gradients (the embedding's is small)
    gathered = comm_free
    if reshard:
        gathered = max(comm_free, t - bwd_r) + ag
        comm_free, busy = gathered, busy + ag
    for i in range(L):
        begin = max(t, gathered)
        if reshard and i + 1 < L:  # the next unit's all-gather, issued as this one's backward starts
            start = max(comm_free, begin)
            gathered = comm_free = start + ag
            busy += ag
        t = begin + bwd_b
        comm_free = max(comm_free, t) + rs
        busy += rs
    comm_free = max(comm_free, t) + rs_root
    busy += rs_root
    return max(t, comm_free), busy


def _host_seconds(block: dict[str, Parts], rest: dict[str, Parts], L: int, layout: Layout, device: Device) -> float:
    """CPU time to issue one microbatch's forward and backward."""
    ops = 0.0
    for phase in ("fwd", "bwd"):
        b, r = block[phase], rest[phase]
        per_block = b.kernels * COMPILED_HOST_OPS_PER_KERNEL if layout.compile else b.host_ops
        ops += L * (per_block + FSDP_UNIT_HOST_OPS) + r.host_ops + FSDP_UNIT_HOST_OPS
    seconds = ops * device.host_op_s
    if layout.tp > 1 and not layout.compile:  # eager DTensor dispatch around every TP matmul
        kernels = sum(L * block[ph].kernels + rest[ph].kernels for ph in ("fwd", "bwd"))
        seconds += kernels * device.host_tp_matmul_s
    return seconds
