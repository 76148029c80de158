"""Step time of one layout from the traced ops and a device table.

Traces of 2 blocks and of a few more (the model's depth, at most TRACED_DEPTH blocks) at 1 and 2
samples give, by difference, what one block and what the rest of the model cost at any microbatch
size (and so at any depth and any pipeline stage's). Each op is priced on the device: matmuls and
attention by shape from the measured tables, everything else by the bytes it moves. TP divides the
matmuls and the sharded activations and adds its all-reduces; FSDP's all-gathers and
reduce-scatters run on a comm stream beside the compute, unit by unit, as FSDP2 issues them
(prefetching one unit ahead); PP runs a stage's share of the blocks with the schedule's bubble.
The CPU issues every op, unit by unit, at the device table's measured host cost (fsdp_lab/calibrate/host.py,
read at the block's kernel time):
a unit's kernels finish no earlier than the host has issued them, so a step whose host work outruns
its GPU work is host-bound (its optimizer runs after the host's last launch), and one whose GPU work
is longer hides the host's."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fsdp_lab.mesh import MESH_DIM_NAMES, degrees, ranks
from fsdp_lab.plan.device import Device
from fsdp_lab.plan.host import kernel_s
from fsdp_lab.plan.trace import FLOAT8_CAST, FLOAT8_WEIGHT_CAST, Trace

# FSDP collectives a block issues one to a unit, resharding after forward (all-gather, re-gather,
# reduce-scatter): the layout the device table's host figures were timed at (fsdp_lab/calibrate/host.py).
CALIBRATED_COLLECTIVES_PER_BLOCK = 3

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
# Without sequence parallelism TP leaves the residual stream and the norms replicated: about this
# share of a block's elementwise traffic (the rest, attention and MLP internals, is split tp ways).
TP_REPLICATED_ELEMENTWISE = 0.4
# torch.compile fuses a block's elementwise chains: the share of their time that remains is measured
# per device (Device.elementwise("compiled_share")); this assumed share stands in for tables without it.
COMPILED_ELEMENTWISE = 0.5
# fused AdamW reads param, grad, exp_avg, exp_avg_sq and writes three (fp32); the gradient norm the
# trainer takes every step (clipping or not) reads the gradient once more. Only for tables that have
# not timed the optimizer's step (Device.optimizer_s): its multi-tensor kernels run below a copy's
# bandwidth (on the H200 the 1b step's took 8.8 ms where these bytes price 7.0).
OPTIMIZER_BYTES_PER_PARAM = 28 + 4
# Clipping (optim.max_norm) reads and writes every float32 gradient once more, inside a fused step
# (fsdp_lab.optim.Optimization.folds_clipping) or as its own pass; the tables time the step unclipped.
# On the H200 at 0.95B these bytes price 1.75 ms, the fused step measured 1.35 ms longer and the pass 2.07.
CLIP_BYTES_PER_PARAM = 8
SHARD_BYTES = 4  # FSDP2 keeps the sharded parameters and their gradients in float32
# The deepest trace (blocks): a block's cost and memory are the difference of two depths, so a few
# blocks tell them for any depth; a 70B model's 80 would take minutes to trace.
TRACED_DEPTH = 4


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
    wrap_group: int = 1  # blocks sharded as one FSDP unit (wrap.group)

    @property
    def world(self) -> int:
        return ranks(self)


@dataclass
class Parts:
    """Seconds of GPU work (and host ops) of one pass over some ops."""

    mm: float = 0.0
    attn: float = 0.0
    mem: float = 0.0
    host_ops: float = 0.0
    kernels: int = 0  # matmul and attention calls
    hidden_bytes: float = 0.0  # one activation of the residual stream (tokens x hidden), for TP's all-reduces
    # float8 casts (trace.FLOAT8_CAST): their ops one by one, as an eager block runs them, and the bytes
    # a compiled block's fused cast kernels move (read twice, written once in float8)
    cast_eager: float = 0.0
    cast_compiled: float = 0.0

    def __sub__(self, o: Parts) -> Parts:
        return Parts(self.mm - o.mm, self.attn - o.attn, self.mem - o.mem, self.host_ops - o.host_ops,
                     self.kernels - o.kernels, self.hidden_bytes, self.cast_eager - o.cast_eager,
                     self.cast_compiled - o.cast_compiled)

    def __truediv__(self, n: float) -> Parts:
        return Parts(self.mm / n, self.attn / n, self.mem / n, self.host_ops / n, self.kernels / n, self.hidden_bytes,
                     self.cast_eager / n, self.cast_compiled / n)


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
        # Ops dispatched grow with the batch where a loop does (the loss's row slices), as the dims do.
        p = Parts(host_ops=one.host_ops[phase] + (two.host_ops[phase] - one.host_ops[phase]) * (mb - 1))
        heavy1 = [o for o in ops1 if o.kind in ("mm", "attn")]
        heavy2 = [o for o in ops2 if o.kind in ("mm", "attn")]
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
        p.mem = _bandwidth_s(ops1, ops2, mb, device, lambda o: o.kind == "mem" and not o.name.startswith(FLOAT8_CAST))
        p.cast_eager = _casts_s(ops1, ops2, mb, tp, device, lambda o: o.kind == "mem" and o.name.startswith(FLOAT8_CAST))
        p.cast_compiled = _casts_s(ops1, ops2, mb, tp, device, lambda o: o.kind == "cast")
        out[phase] = p
    return out


@dataclass
class Model:
    """What the traces of one AC mode say about the model, ready to price any layout."""

    traces: dict[tuple[int, int], Trace]  # (blocks, samples) -> trace: (1, 1), (2, 1), (2, 2), (depth, 1), (depth, 2)
    layers: int  # the model's blocks
    depth: int  # the deeper traces' blocks: min(layers, TRACED_DEPTH)
    block_params: int  # parameters of all blocks
    other_params: int
    param_bytes: int  # bytes per element the all-gathers move (fsdp.param_dtype)
    reduce_bytes: int  # ... and the reduce-scatters (fsdp.reduce_dtype)
    seq_len: int
    tp_all_reduces: tuple[int, int]  # (forward, backward) a block issues under TP (parallel/tp.block_all_reduces)
    clips: bool = False  # optim.max_norm is set
    float8_share: float = 0.0  # of the blocks' matmuls, run in float8 (float8.recipe)
    op_ac_share: float = 0.0  # of the blocks, checkpointed under the op-level policy (ac=selective, ac.selective=op)
    _priced: dict = field(default_factory=dict, repr=False)  # (mb, tp, device) -> parts: the search prices many layouts alike

    def parts(self, mb: int, tp: int, device: Device) -> tuple[dict[str, Parts], dict[str, Parts]]:
        """(one block, the rest of the model) per phase, at microbatch size mb. Beyond 2 blocks, from
        the deeper traces and 2 blocks, each priced op by op at mb samples: the blocks and the rest grow
        with the batch at different rates (the output layer's matmul is efficient at any batch), so the
        1-block trace, which has one sample only, would misplace the difference between them."""
        key = (mb, tp, device.name)
        if key not in self._priced:
            self._priced[key] = self._parts(mb, tp, device)
        return self._priced[key]

    def _parts(self, mb: int, tp: int, device: Device) -> tuple[dict[str, Parts], dict[str, Parts]]:
        t, D = self.traces, self.depth
        two = price(t[(2, 1)], t[(2, 2)], mb, tp, device)
        if D > 2:
            deep = price(t[(D, 1)], t[(D, 2)], mb, tp, device)
            block = {ph: (deep[ph] - two[ph]) / (D - 2) for ph in two}
        else:
            block = {ph: two[ph] - _price_like(t[(1, 1)], t[(2, 1)], t[(2, 2)], mb, tp, device)[ph] for ph in two}
        rest = {ph: two[ph] - block[ph] - block[ph] for ph in two}
        return block, rest


def _bandwidth_s(ops1: list, ops2: list, mb: int, device: Device, chosen) -> float:
    """Seconds of the chosen elementwise ops of a 1-sample pass at mb samples: their bytes grow with the
    batch as those of the 2-sample pass do."""
    bytes1 = sum(o.dims[0] for o in ops1 if chosen(o))
    bytes2 = sum(o.dims[0] for o in ops2 if chosen(o))
    ratio = (bytes1 + (bytes2 - bytes1) * (mb - 1)) / bytes1 if bytes1 else 1.0
    return sum(device.memory_s(o.dims[0] * ratio) for o in ops1 if chosen(o))


def _casts_s(ops1: list, ops2: list, mb: int, tp: int, device: Device, chosen) -> float:
    """Seconds of the chosen float8 casts. Under TP a rank casts only its shard of each weight (the
    families' plans split every linear of a block); an activation's cast is priced whole (a column-wise
    layer's input is replicated on every rank)."""
    weight = lambda o: o.name.startswith(FLOAT8_WEIGHT_CAST)  # noqa: E731
    weights = _bandwidth_s(ops1, ops2, mb, device, lambda o: chosen(o) and weight(o))
    return weights / tp + _bandwidth_s(ops1, ops2, mb, device, lambda o: chosen(o) and not weight(o))


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
                        s.host_ops, s.kernels, f.hidden_bytes, s.cast_eager * grow(f.cast_eager, a.cast_eager),
                        s.cast_compiled * grow(f.cast_compiled, a.cast_compiled))
    return out


def group_link(layout: Layout, dim: str, gpus_per_node: int) -> tuple[int, bool]:
    """(size, crosses nodes) of a mesh dimension's groups; ranks are laid out pp, dp_replicate, dp_shard, tp."""
    order = MESH_DIM_NAMES
    sizes = degrees(layout)
    stride = math.prod(sizes[d] for d in order[order.index(dim) + 1 :])
    return sizes[dim], stride * sizes[dim] > gpus_per_node


@dataclass(frozen=True)
class Work:
    """One unit's forward or backward: seconds on the GPU and seconds the host takes to issue it."""

    gpu: float
    host: float


def step_time(model: Model, layout: Layout, device: Device, gpus_per_node: int) -> dict:
    """Predicted seconds per optimizer step, with its parts."""
    L = model.layers // layout.pp
    block, rest = model.parts(layout.microbatch_size, layout.tp, device)
    tp, shard = layout.tp, layout.dp_shard
    tp_size, tp_inter = group_link(layout, "tp", gpus_per_node)
    sh_size, sh_inter = group_link(layout, "dp_shard", gpus_per_node)
    rep_size, rep_inter = group_link(layout, "dp_replicate", gpus_per_node)
    pp_size, pp_inter = group_link(layout, "pp", gpus_per_node)

    # A block's elementwise ops run at the measured share of the bandwidth pricing (absent: the
    # pricing as it is), and compiled at the measured share of that (absent: the assumed share).
    eager_factor = device.elementwise("eager_factor", unmeasured=1.0)
    compiled_share = device.elementwise("compiled_share", unmeasured=COMPILED_ELEMENTWISE)

    # float8: the blocks' converted matmuls at the table's measured float8/bf16 time ratio (absent: as
    # bf16); their casts by the bytes they move, op by op in an eager block, fused in a compiled one.
    float8_mm = 1 - model.float8_share * (1 - (device.float8_matmul_ratio or 1.0))

    def gpu(p: Parts, in_block: bool) -> float:
        factor, mm, cast = 1.0, p.mm, p.cast_eager
        if in_block:
            factor = eager_factor * (TP_REPLICATED_ELEMENTWISE + (1 - TP_REPLICATED_ELEMENTWISE) / tp)
            factor *= compiled_share if layout.compile else 1.0
            mm *= float8_mm
            cast = p.cast_compiled if layout.compile else cast
        return mm + p.attn + p.mem * factor + cast

    # the host's cost per op follows the kernels' size, and the ranks it issues a step over
    host = device.host_figures(kernel_s(block["fwd"]), layout.world)
    tp_ar = device.collective_s("all_reduce", block["fwd"].hidden_bytes, tp_size, tp_inter) if tp > 1 else 0.0
    tp_host = host.get("tp_kernel_s", 0.0) if tp > 1 else 0.0  # absent: measured without TP (one GPU)

    block_ops = block["fwd"].host_ops + block["bwd"].host_ops

    def issue(p: Parts, in_block: bool) -> float:
        """Host seconds to issue p: compiled blocks a call per kernel (DTensor's dispatch traced away);
        an eager block's pass its ops at the table's cost per block op and its share (by ops) of the
        seconds per block (absent: every op at the mean cost per op, nothing per block)."""
        if in_block and layout.compile:
            return p.kernels * host["compiled_kernel_s"]
        op_s, per_block = host["op_s"], 0.0
        if in_block:
            op_s = host.get("block_op_s", op_s)
            per_block = host.get("block_s", 0.0) * p.host_ops / block_ops if block_ops else 0.0
        return p.host_ops * op_s + p.kernels * tp_host + per_block

    # A checkpointed block's backward: its recomputed ops are in the trace; checkpoint's own host work
    # is the table's per-block figure, eager or compiled (absent: not calibrated, 0; a table with the
    # eager figure alone gives it to compiled blocks too).
    # Op-level selective AC's policy runs in Python per op of an eager block's forward and recompute: its
    # own per-block figure, over the share of blocks it checkpoints (compiled: traced away).
    ac_key = "ac_compiled_block_s" if layout.compile and "ac_compiled_block_s" in host else "ac_block_s"
    if layout.ac == "full":
        ac_host = host.get(ac_key, 0.0)
    else:
        ac_host = 0.0 if layout.compile else host.get("op_ac_block_s", 0.0) * model.op_ac_share
    # TP's host work the per-kernel figure does not see (absent: not calibrated, 0): DTensor at a compiled
    # block's edges, per block and microbatch (the runs time whole steps: half to each pass), and a
    # checkpointed eager block's beyond its kernels.
    tp_compiled = host.get("tp_compiled_block_s", 0.0) if tp > 1 and layout.compile else 0.0
    tp_ac = host.get("tp_ac_block_s", 0.0) if tp > 1 and layout.ac == "full" and not layout.compile else 0.0
    unit = model.block_params / model.layers / tp
    root = model.other_params / tp / (layout.pp if layout.pp > 1 else 1)

    # FSDP2's copies around its collectives, on the GPU (whatever the group's size, one GPU too): an
    # all-gather casts the float32 shard into its buffer and splits the gathered buffer into the
    # parameters; a reduce-scatter concatenates the gradients in the reduce dtype and writes its
    # shard into the float32 gradient. The profiler shows them serialised with the compute kernels.
    def gather_copies(n):
        return device.memory_s(n / shard * (SHARD_BYTES + model.param_bytes)) + device.memory_s(2 * n * model.param_bytes)

    def reduce_copies(n):
        return device.memory_s(n * (model.param_bytes + model.reduce_bytes)) + device.memory_s(2 * n / shard * SHARD_BYTES)

    regather = gather_copies(unit) if layout.reshard else 0.0
    # TP's all-reduces block the compute stream: as many as the family's plan issues each way (a
    # transformer's attention and MLP once each, its q/k/v gradients summed before theirs).
    ar_fwd, ar_bwd = model.tp_all_reduces
    fwd_b = Work(gpu(block["fwd"], True) + ar_fwd * tp_ar + gather_copies(unit), issue(block["fwd"], True) + tp_compiled / 2)
    bwd_b = Work(gpu(block["bwd"], True) + ar_bwd * tp_ar + regather + reduce_copies(unit),
                 issue(block["bwd"], True) + ac_host + tp_compiled / 2 + tp_ac)
    fwd_r = Work(gpu(rest["fwd"], False) + tp_ar + gather_copies(root), issue(rest["fwd"], False))
    bwd_r = Work(gpu(rest["bwd"], False) + tp_ar + reduce_copies(root), issue(rest["bwd"], False))

    def gather(n): return device.collective_s("all_gather", n * model.param_bytes, sh_size, sh_inter) if shard > 1 else 0.0
    def reduce(n):
        t = device.collective_s("reduce_scatter", n * model.reduce_bytes, sh_size, sh_inter) if shard > 1 else 0.0
        return t + device.collective_s("all_reduce", n * model.reduce_bytes / shard, rep_size, rep_inter)

    # wrap.group=g: g blocks gathered and reduced as one unit (one collective each, latency paid once).
    # The host figures were timed one block to a unit, resharding: a block's price holds FSDP's host work
    # for its all-gather (forward), its re-gather and its reduce-scatter (backward). A layout issuing
    # fewer (larger units; no re-gather) saves the table's seconds per collective not issued, eager or
    # compiled (absent: not calibrated, 0).
    g = layout.wrap_group
    per_collective = host.get("fsdp_compiled_collective_s" if layout.compile else "fsdp_collective_s", 0.0)
    fwd_hooks = per_collective * (1 - g)
    bwd_hooks = per_collective * ((2 if layout.reshard else 1) - (CALIBRATED_COLLECTIVES_PER_BLOCK - 1) * g)
    # Each FSDP collective waits for the last rank to issue it, so the ranks' GPUs follow the slowest
    # rank's host, where the table timed rank 0's: its host work at the table's ratio of the two
    # (slowest_host; absent or one rank: 1).
    lag = host.get("slowest_host", 1.0) if layout.world > 1 else 1.0
    mb = _simulate(L // g, _times(fwd_b, g, fwd_hooks), _times(bwd_b, g, bwd_hooks), fwd_r, bwd_r,
                   gather(g * unit), reduce(g * unit), gather(root), reduce(root), layout.reshard, lag)
    per_mb = max(mb["gpu"], mb["host"])
    if layout.pp > 1:
        p2p = device.collective_s("all_gather", 2 * block["fwd"].hidden_bytes, 2, pp_inter)
        passes = (layout.microbatches + layout.pp - 1) * (per_mb + 2 * p2p)
    else:
        passes = layout.microbatches * per_mb
    local_params = (model.block_params / layout.pp + root * tp) / tp / shard
    optimizer = device.optimizer_s(local_params)
    if optimizer is None:
        optimizer = device.memory_s(local_params * OPTIMIZER_BYTES_PER_PARAM)
    if model.clips:
        optimizer += device.memory_s(local_params * CLIP_BYTES_PER_PARAM)
    # The step's own host work (the gradient norm, the optimizer's launch, zero_grad, the probes' marks) follows
    # the last backward's issue, while the GPU may still be running it.
    step_host = host["step_s"] + (host.get("tp_step_s", 0.0) if tp > 1 else 0.0) + (host["compiled_step_s"] if layout.compile else 0.0)
    # Each microbatch after the first adds gradient accumulation's host work (absent: not calibrated).
    accumulate = (layout.microbatches - 1) * (L * host.get("microbatch_block_s", 0.0) + host.get("microbatch_rest_s", 0.0))
    host_s = layout.microbatches * mb["host"] + (accumulate + step_host) * lag
    # The optimizer's kernels run once the GPU has done the backward and the host has launched them,
    # near the end of its step work: a host-bound step ends the optimizer's time after the host.
    step = max(passes, host_s) + optimizer
    # Host-bound: the GPU waits for the host a tenth of the time or more, or the host's work sets the step.
    host_bound = mb["idle"] > 0.1 * mb["gpu"] or host_s > passes
    return {"step_time_s": step, "gpu_s": mb["gpu"], "host_s": host_s / lag, "comm_s": mb["comm"],
            "optimizer_s": optimizer, "host_bound": host_bound}


def _times(work: Work, n: int, unit_host: float) -> Work:
    """n blocks' work as one FSDP unit, whose hooks add unit_host to the host's (a saving: less)."""
    return Work(work.gpu * n, max(work.host * n + unit_host, 0.0))


def _simulate(L: int, fb: Work, bb: Work, fr: Work, br: Work, ag, rs, ag_root, rs_root, reshard, lag: float = 1.0) -> dict[str, float]:
    """One microbatch's forward and backward on a compute stream, a comm stream and the host: FSDP2
    all-gathers a unit one ahead of its compute (two in flight at most, issued no earlier than the
    host reaches it) and reduce-scatters it after its backward; a unit's compute ends no earlier than
    the host has issued it, the host taking `lag` times its work (the slowest rank's). Returns the GPU's
    end, the host's end, the comm stream's busy seconds and the compute stream's seconds spent waiting
    for the host."""
    s = {"host": 0.0, "idle": 0.0}

    def run(t: float, work: Work) -> float:
        """The compute stream, free at t, runs work once the host has issued it."""
        s["host"] += work.host * lag
        end = t + work.gpu
        s["idle"] += max(s["host"] - end, 0.0)
        return max(end, s["host"])

    comm_free = ag_root
    t = comm_free
    ends = [0.0, 0.0]
    busy = ag_root
    for _ in range(L):  # forward: the rest of the model (output, loss) runs after the blocks
        start = max(comm_free, ends[-2], s["host"])
        comm_free = start + ag
        busy += ag
        t = run(max(t, comm_free), fb)
        ends.append(t)
    t = run(run(t, fr), br)  # output and loss, their gradients (the embedding's is small)
    gathered = comm_free
    if reshard:
        gathered = max(comm_free, t - br.gpu) + ag
        comm_free, busy = gathered, busy + ag
    for i in range(L):
        begin = max(t, gathered)
        if reshard and i + 1 < L:  # the next unit's all-gather, issued as this one's backward starts
            start = max(comm_free, begin, s["host"])
            gathered = comm_free = start + ag
            busy += ag
        t = run(begin, bb)
        comm_free = max(comm_free, t) + rs
        busy += rs
    comm_free = max(comm_free, t) + rs_root
    busy += rs_root
    return {"gpu": max(t, comm_free), "host": s["host"], "comm": busy, "idle": s["idle"]}
