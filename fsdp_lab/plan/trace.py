"""The step's ops, recorded where the estimate traces it: `fsdp_lab.estimate.estimate` runs the real
parallelize path on a fake process group under FakeTensorMode, and the measured step runs under
OpRecorder, which keeps each op's kind, local shape and phase. The same call gives the step's
memory. Collectives are left out here: the cost model prices FSDP's and TP's from the parameters
and the layout, for any group size, so one small fake world serves every candidate."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from fsdp_lab.config import ConfigError, RunConfig
from fsdp_lab.models.kernels.launch import watching_launches
from fsdp_lab.mesh import ParallelDims, degrees
from fsdp_lab.parallel.float8 import float8_operand

MATMULS = {"mm", "addmm", "bmm", "baddbmm"}
# Ops that move no bytes on a GPU (allocations, views, metadata): host work only.
FREE = {"empty", "empty_like", "empty_strided", "detach", "alias", "lift_fresh", "_local_scalar_dense", "set_", "_unsafe_view"}
TRACE_WORLD = 2  # the smallest world that shards: FSDP's path, its hooks and buffers, at the least cost


@dataclass(frozen=True)
class Op:
    name: str  # the aten op
    kind: str  # mm | attn | mem | cast (a float8 cast as compiled kernels run it: _Float8Casts)
    phase: str  # fwd | bwd | opt
    dims: tuple  # mm: (m, n, k); attn: (batch x heads, seq, head dim); mem, cast: (bytes,)
    dtype: str


class OpRecorder(TorchDispatchMode):
    """Records every op that runs on plain (local) tensors: views cost nothing, DTensor ops come back
    as the local ops they run, c10d ops are priced by the cost model. RMSNorm runs as the GPU runs it:
    one fused kernel each way (on the CPU it decomposes into a chain of fp32 elementwise ops); each
    launch of the lab's Triton kernels (models/kernels/), which no aten op shows, is one kernel that
    reads and writes its tensor arguments."""

    def __init__(self):
        super().__init__()
        self.ops: list[Op] = []
        self.dispatched: list[bool] = []  # every op dispatched (views included: host work), in backward or not
        self.paused = False
        self.prefix = ""  # names the ops of a float8 cast (_Float8Casts)
        self._fused = _FusedKernels(self)
        self._casts = _Float8Casts(self)

    def __enter__(self):
        self._fused.__enter__()
        self._casts.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self._casts.__exit__(*exc)
        return self._fused.__exit__(*exc)

    def record(self, name: str, tensors: list[torch.Tensor]) -> None:
        """One fused elementwise kernel that reads and writes `tensors`."""
        phase = _phase()
        self.dispatched.append(phase == "bwd")
        dtype = str(tensors[0].dtype).removeprefix("torch.")
        self.ops.append(Op(name, "mem", phase, (_nbytes(tensors),), dtype))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.paused:
            return out
        self.dispatched.append(_in_backward())
        op = _classify(func, args, kwargs or {}, out)
        if op is not None:
            self.ops.append(dataclasses.replace(op, name=self.prefix + op.name) if self.prefix else op)
        return out


class _FusedRMSNorm(torch.autograd.Function):
    """F.rms_norm as CUDA's fused kernel: one kernel forward, one backward, keeping the input."""

    @staticmethod
    def forward(ctx, recorder, x, shape, weight, eps):
        recorder.paused = True
        try:
            out = F.rms_norm(x, shape, weight, eps)
        finally:
            recorder.paused = False
        recorder.record("fused_rms_norm", [x, out])
        ctx.recorder, ctx.shape, ctx.eps = recorder, shape, eps
        ctx.save_for_backward(x, weight)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        recorder = ctx.recorder
        recorder.paused = True
        try:
            with torch.enable_grad():
                inputs = [x.detach().requires_grad_()] + ([weight.detach().requires_grad_()] if weight is not None else [])
                out = F.rms_norm(inputs[0], ctx.shape, inputs[1] if weight is not None else None, ctx.eps)
                grads = torch.autograd.grad(out, inputs, grad)
        finally:
            recorder.paused = False
        recorder.record("fused_rms_norm_backward", [x, grad, grads[0]])
        return None, grads[0], None, grads[1] if weight is not None else None, None


class _FusedKernels:
    """nn.RMSNorm's forward through _FusedRMSNorm while recording (its recomputation under activation
    checkpointing too, which calls the module's forward again), and the Triton kernels' launches."""

    def __init__(self, recorder: OpRecorder):
        self.recorder = recorder
        self.launches = watching_launches(lambda name, tensors, constants: recorder.record(name, tensors))

    def __enter__(self):
        self.launches.__enter__()
        recorder, self.original = self.recorder, nn.RMSNorm.forward

        def forward(module: nn.RMSNorm, x: torch.Tensor) -> torch.Tensor:
            if recorder.paused or not (type(x) is torch.Tensor or _is_fake(x)):
                return self.original(module, x)
            return _FusedRMSNorm.apply(recorder, x, module.normalized_shape, module.weight, module.eps)

        nn.RMSNorm.forward = forward
        return self

    def __exit__(self, *exc):
        nn.RMSNorm.forward = self.original
        return self.launches.__exit__(*exc)


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def _classify(func, args, kwargs, out) -> Op | None:
    namespace, name = func.namespace, func._opname
    if namespace != "aten" or name in FREE:
        return None
    flat_in = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
    phase = _phase()
    if name in MATMULS and any(float8_operand(t) for t in args[-2:]):
        # torchao's float8 matmul: the subclass runs it (emulated on this CPU) where this mode cannot see
        # it. Recorded in its operands' high-precision dtype: the cost model prices the blocks' converted
        # share at the device's float8 rate (plan/cost.py).
        return _matmul(name, args, phase, str(args[-2]._orig_dtype).removeprefix("torch."))
    if any(type(t) is not torch.Tensor and not _is_fake(t) for t in flat_in):
        return None  # a subclass (DTensor): its local ops come through here again
    returns = func._schema.returns
    if returns and all(r.alias_info is not None and not r.alias_info.is_write for r in returns):
        return None  # a view
    dtype = str(flat_in[0].dtype).removeprefix("torch.") if flat_in else "float32"
    if name in MATMULS:
        return _matmul(name, args, phase, dtype)
    if "scaled_dot_product" in name:
        q = args[0] if "backward" not in name else args[1]
        return Op(name, "attn", phase, (q.shape[0] * q.shape[1], q.shape[2], q.shape[3]), dtype)
    outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    written = [t for t in outs if not any(t is i for i in flat_in)]
    return Op(name, "mem", phase, (_nbytes(flat_in) + _nbytes(written),), dtype)


def _in_backward() -> bool:
    """Whether autograd's engine is running: the op belongs to a backward pass."""
    return torch._C._current_graph_task_id() != -1


def _phase() -> str:
    return "bwd" if _in_backward() else "fwd"


def _matmul(name: str, args, phase: str, dtype: str) -> Op:
    a, b = args[-2], args[-1]
    batch = a.shape[0] if name in ("bmm", "baddbmm") else 1
    return Op(name, "mm", phase, (batch * a.shape[-2], b.shape[-1], a.shape[-1]), dtype)


# The ops of one float8 cast (amax, scale, scaled copy) are named with this prefix; beside them one op of
# kind "cast" holds the bytes torch.compile's fused kernels move for it (plan/cost.py prices either).
FLOAT8_CAST = "float8_cast"
FLOAT8_WEIGHT_CAST = FLOAT8_CAST + ".weight"  # a weight's cast: under TP a rank casts only its shard


class _Float8Casts:
    """Each of torchao's dynamic float8 casts (an input, a weight, a gradient; hp_tensor_to_float8_dynamic,
    wherever torchao calls it) recorded twice over: its eager chain of ops, as a GPU runs them uncompiled,
    named FLOAT8_CAST + "." (a weight's FLOAT8_WEIGHT_CAST + "."); and one op of kind "cast", the bytes
    compiled kernels move for it: the high-precision tensor read for its amax and again for the cast,
    the float8 copy written."""

    NAME = "hp_tensor_to_float8_dynamic"

    def __init__(self, recorder: OpRecorder):
        self.recorder = recorder
        self.patched: list[tuple[object, object]] = []

    def __enter__(self):
        recorder = self.recorder
        for module in [m for name, m in sys.modules.items() if name.startswith("torchao.float8") and m is not None]:
            original = getattr(module, self.NAME, None)
            if original is None:
                continue

            def cast(hp_tensor, *args, _original=original, **kwargs):
                if recorder.paused or recorder.prefix:
                    return _original(hp_tensor, *args, **kwargs)
                role = kwargs.get("gemm_input_role")  # torchao passes it by name
                name = FLOAT8_WEIGHT_CAST if getattr(role, "name", None) == "WEIGHT" else FLOAT8_CAST
                recorder.prefix = name + "."
                try:
                    out = _original(hp_tensor, *args, **kwargs)
                finally:
                    recorder.prefix = ""
                local = hp_tensor.to_local() if hasattr(hp_tensor, "to_local") else hp_tensor
                dtype = str(local.dtype).removeprefix("torch.")
                recorder.ops.append(Op(name, "cast", _phase(), (local.numel() * (2 * local.element_size() + 1),), dtype))
                return out

            self.patched.append((module, original))
            setattr(module, self.NAME, cast)
        return self

    def __exit__(self, *exc):
        for module, original in self.patched:
            setattr(module, self.NAME, original)
        self.patched = []


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def traced_on() -> str:
    """The torch whose ops the trace records: versions dispatch other ops (one commit's Llama block
    traced 529 ops on torch 2.11, 531 on 2.13), so a table's fitted figures name it."""
    return f"torch {torch.__version__}"


@dataclass
class Trace:
    ops: list[Op]
    host_ops: dict[str, int]  # ops dispatched (views included) in forward and in backward: host work
    peak_bytes: float


def traced_run(run: RunConfig, *, batch: int, ac: str) -> tuple[RunConfig, ParallelDims]:
    """The configuration a trace runs: `batch` samples in one microbatch, FSDP over the trace world with
    a unit per block, no TP, PP, grouping or compile (the cost model adds those); `layers` blocks (None =
    the model's own depth) are kept where trace_step builds it (fsdp_lab.models.depth.blocks_kept)."""
    model = dataclasses.replace(run.model, compile=False)
    dims = ParallelDims.resolve(TRACE_WORLD)
    traced = dataclasses.replace(
        run, mode="estimate", model=model,
        mesh=dataclasses.replace(run.mesh, **degrees(dims), world_size=TRACE_WORLD, sequence_parallel=False),
        train=dataclasses.replace(run.train, batch_size=batch, microbatches=1),
        ac=dataclasses.replace(run.ac, mode=ac), fsdp=dataclasses.replace(run.fsdp, reshard_after_forward=True),
        wrap=dataclasses.replace(run.wrap, group=1),
    )
    return traced, dims


@contextlib.contextmanager
def quiet():
    """The parallelize steps' log lines, once per trace, say nothing new: keep warnings only."""
    lab_log = logging.getLogger("fsdp_lab")
    level = lab_log.level
    lab_log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        lab_log.setLevel(level)


def trace_step(run: RunConfig, layers: int | None, batch: int, ac: str) -> Trace:
    from fsdp_lab.estimate import estimate
    from fsdp_lab.models.depth import blocks_kept

    traced, dims = traced_run(run, batch=batch, ac=ac)
    recorder = OpRecorder()
    with quiet(), blocks_kept(layers):
        result = estimate(traced, dims, around_step=lambda: recorder)
    ops = recorder.ops
    last_bwd = max((i for i, op in enumerate(ops) if op.phase == "bwd"), default=len(ops) - 1)
    ops = [op if i <= last_bwd else dataclasses.replace(op, phase="opt") for i, op in enumerate(ops)]
    in_bwd = recorder.dispatched
    end = max((i for i, b in enumerate(in_bwd) if b), default=len(in_bwd) - 1)
    host_ops = {"bwd": sum(in_bwd), "fwd": sum(1 for b in in_bwd[:end] if not b)}
    return Trace(ops, host_ops, result["peak_mib"] * 2**20)


@dataclass(frozen=True)
class ModelFacts:
    layers: int  # the repeated blocks (model.blocks)
    block_params: int  # parameters inside the blocks
    other_params: int
    flops_per_token: float
    tokens_per_sample: int
    tp_all_reduces: tuple[int, int]  # (forward, backward) a block issues under its family's TP plan; (0, 0) without one
    float8_share: float = 0.0  # of the blocks' matmuls, converted to float8 (parallel/float8.py)


def model_facts(run: RunConfig) -> ModelFacts:
    """What the plan needs to know of any model the lab trains, from the instance its spec builds on
    the meta device: its blocks (how many, their parameters) and what sits outside them."""
    from fsdp_lab.models import build_meta, model_spec
    from fsdp_lab.parallel.float8 import converted_block_share
    from fsdp_lab.parallel.tp import block_all_reduces

    model = build_meta(run.model)
    blocks = list(model.blocks)
    if not blocks:
        raise ConfigError(f"model.name={run.model.name}: mode=plan prices a model by its repeated blocks, and this one has "
                          "none (model.blocks=null); allowed: a model with blocks")
    in_blocks = {id(p): p.numel() for b in blocks for p in b.parameters()}
    total = sum(p.numel() for p in model.parameters())
    seq = run.train.seq_len
    tp_plan = model_spec(run.model.name).tp_plan
    tp_all_reduces = block_all_reduces(tp_plan(run.model, run.mesh.sequence_parallel)[1]) if tp_plan else (0, 0)
    return ModelFacts(len(blocks), sum(in_blocks.values()), total - sum(in_blocks.values()), model.flops_per_token(seq),
                      model.tokens_per_sample(seq), tp_all_reduces, converted_block_share(model, run.float8))
