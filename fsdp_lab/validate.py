"""Checks a composed config before any rank starts: each failure is one ConfigError line naming
the key, the value and what is allowed. Grow this file with every new knob."""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch
from omegaconf import DictConfig

from fsdp_lab.checkpoint import CheckpointError, check_compatible, verify
from fsdp_lab.checks import parse as parse_check
from fsdp_lab.config import ConfigError, FSDPConfig, MeshConfig, RunConfig, TrainConfig, to_run_config
from fsdp_lab.dist import default_world_size, is_rank_process, resolve_device_type
from fsdp_lab.freeze import frozen_names, mixed_units
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.models import SPECS, build_meta, count_params, model_spec
from fsdp_lab.models.spec import ModelSpec
from fsdp_lab.estimate.pipeline import ESTIMABLE_SCHEDULES
from fsdp_lab.parallel.pipeline import MULTI_STAGE_SCHEDULES, stages_per_rank
from fsdp_lab.parallel.wrap import wrap_units
from fsdp_lab.probes.registry import check_probes


def prepare(cfg: DictConfig) -> tuple[RunConfig, ParallelDims]:
    """The typed, checked run and its parallel dimensions."""
    run = to_run_config(cfg)
    if run.mode == "estimate":
        return _prepare_estimate(run)
    if run.mode == "plan":
        return _prepare_plan(run)
    device_type = resolve_device_type(run.device)
    dims = ParallelDims.resolve(
        pp=run.mesh.pp, dp_replicate=run.mesh.dp_replicate, dp_shard=run.mesh.dp_shard, tp=run.mesh.tp,
        world_size=_world_size(run, device_type),
    )
    derive_batch_size(run.train, dims)
    check_run(run, dims, device_type)
    return run, dims


def _prepare_estimate(run: RunConfig) -> tuple[RunConfig, ParallelDims]:
    """mode=estimate predicts a world this machine may not have: its size comes from the degrees, and
    it is checked as the GPU run it predicts (GPU-only dtypes are fine)."""
    m = run.mesh
    if m.dp_shard == -1 and m.world_size is None:
        raise ConfigError("mesh.dp_shard=-1: mode=estimate needs the world size; set mesh.dp_shard=N or mesh.world_size=N")
    dims = ParallelDims.resolve(
        pp=m.pp, dp_replicate=m.dp_replicate, dp_shard=m.dp_shard, tp=m.tp, world_size=requested_world_size(m, m.world_size),
    )
    check_estimable(run)  # first: what cannot be estimated at all says so before finer checks
    derive_batch_size(run.train, dims)
    check_run(run, dims, "cuda")
    return run, dims


def _prepare_plan(run: RunConfig) -> tuple[RunConfig, ParallelDims]:
    """mode=plan picks the mesh itself: the run's own mesh is not checked; its dims are plan.gpus of FSDP."""
    from fsdp_lab.plan.run import check_plan

    check_plan(run)
    return run, ParallelDims.resolve(pp=1, dp_replicate=1, dp_shard=run.plan.gpus, tp=1, world_size=run.plan.gpus)


def check_estimable(run: RunConfig) -> None:
    """Configurations mode=estimate cannot predict faithfully."""
    refusals = {
        "mesh.engine": (run.mesh.engine, run.mesh.engine != "fsdp2", "allowed: fsdp2 (FSDPMemTracker follows fully_shard only)"),
        # Pipelines are estimated through the schedule's order of microbatches (estimate/pipeline.py),
        # which is written for the single-stage schedules; a sequence-parallel stage boundary is a shard.
        "mesh.pp_schedule": (run.mesh.pp_schedule, run.mesh.pp > 1 and run.mesh.pp_schedule not in ESTIMABLE_SCHEDULES,
                             f"allowed with mesh.pp>1: {', '.join(ESTIMABLE_SCHEDULES)} (one stage per rank)"),
        "mesh.sequence_parallel": (run.mesh.sequence_parallel, run.mesh.pp > 1 and run.mesh.sequence_parallel,
                                   "allowed with mesh.pp>1: false (stages would receive sequence shards)"),
        "fsdp.cpu_offload": (run.fsdp.cpu_offload, run.fsdp.cpu_offload, "allowed: false (the estimate runs on one fake device)"),
        "model.compile": (run.model.compile, run.model.compile, "allowed: false (compiled graphs are not traced by the tracker)"),
        "fsdp.cast_after_sharding": (run.fsdp.cast_after_sharding, run.fsdp.cast_after_sharding is not None, "allowed: null (the estimate does not cast)"),
        "train.standalone_layer": (run.train.standalone_layer, run.train.standalone_layer is not None, "allowed: null (the estimate runs one step of the whole model)"),
    }
    for key, (value, refused, allowed) in refusals.items():
        if refused:
            value = str(value).lower() if isinstance(value, bool) else value
            raise ConfigError(f"{key}={value}: mode=estimate cannot predict this; {allowed}")


def _world_size(run: RunConfig, device_type: str) -> int:
    if is_rank_process():
        return int(os.environ["WORLD_SIZE"])
    world = requested_world_size(run.mesh, default_world_size(device_type, run.mesh.cpu_world_size))
    if device_type == "cuda" and world > torch.cuda.device_count():
        raise ConfigError(f"mesh: world size {world} needs {world} GPUs, but {torch.cuda.device_count()} are visible")
    return world


def requested_world_size(m: MeshConfig, default: int) -> int:
    """The ranks a mesh asks for: the product of its degrees, or `default` when dp_shard=-1 fills any world."""
    if m.dp_shard == -1:
        return m.world_size or default
    world = m.pp * m.dp_replicate * m.dp_shard * m.tp
    if m.world_size is not None and m.world_size != world:
        raise ConfigError(
            f"mesh.world_size={m.world_size}, but pp={m.pp} x dp_replicate={m.dp_replicate} x "
            f"dp_shard={m.dp_shard} x tp={m.tp} = {world}"
        )
    return world


def derive_batch_size(t: TrainConfig, dims: ParallelDims) -> None:
    """train.global_batch_size, when set, decides the per-rank train.batch_size."""
    if t.global_batch_size is None:
        return
    if t.global_batch_size % dims.dp:
        raise ConfigError(
            f"train.global_batch_size={t.global_batch_size}: must be a multiple of the data-parallel size "
            f"{dims.dp} (mesh.dp_replicate={dims.dp_replicate} x mesh.dp_shard={dims.dp_shard})"
        )
    t.batch_size = t.global_batch_size // dims.dp


def check_run(run: RunConfig, dims: ParallelDims, device_type: str, model=None) -> None:
    """`model`: run.model built on meta, where the caller holds one (mode=plan checks thousands of layouts of one model)."""
    t = run.train
    if t.batch_size % t.microbatches:
        raise ConfigError(f"train.microbatches={t.microbatches}: must divide train.batch_size={t.batch_size}")
    family = model_spec(run.model.name)
    model = model if model is not None else build_meta(run.model)  # parameters on meta: shapes and structure, no memory
    _check_fsdp(run, dims, device_type, family)
    _check_accum(run, dims)
    _check_tp(run, dims, family)
    _check_pp(run, dims, family, model)
    _check_ac(run, family)
    _check_checkpoint(run)
    _check_freeze(run, model)
    _check_module_calls(run, dims, device_type, family, model)
    family.check(run.model, run, dims, model)
    _check_parity_fits(run, dims, device_type, count_params(model))
    for spec in run.checks:
        parse_check(spec)
    check_probes(run, dims)
    f = run.fault
    if f.kill_rank is not None and f.kill_rank >= dims.world_size:
        raise ConfigError(f"fault.kill_rank={f.kill_rank}: must be a rank in 0..{dims.world_size - 1}")
    if (f.kill_rank is None) != (f.at_step is None):
        raise ConfigError("fault.kill_rank and fault.at_step: set both or neither")
    if (f.kind == "corrupt_grad") != (f.module is not None):
        raise ConfigError(f"fault.module={f.module} with fault.kind={f.kind}: fault.kind=corrupt_grad needs fault.module=PATH, and only it takes one")
    if f.kind == "corrupt_grad":
        _check_corrupt_grad(run)


def _check_corrupt_grad(run: RunConfig) -> None:
    f = run.fault
    if f.phase != "step":
        raise ConfigError(f"fault.phase={f.phase} with fault.kind=corrupt_grad: gradients exist during a step; allowed: step")
    if run.mesh.engine == "fsdp1" and not run.fsdp.use_orig_params:
        raise ConfigError("fault.kind=corrupt_grad with mesh.engine=fsdp1: its modules' gradients live in flat parameters; allowed with fsdp.use_orig_params=true")
    model = build_meta(run.model)
    names = [name for name, m in model.named_modules() if name and any(True for _ in m.parameters())]
    if f.module not in names:
        raise ConfigError(f"fault.module={f.module}: not a module with parameters of model.name={run.model.name}; allowed: a module holding parameters, e.g. {names[0]}, {names[-1]}")


# What the parity reference holds per parameter: fp32 weight, gradient and two optimizer states.
REFERENCE_BYTES_PER_PARAM = 16


def _check_parity_fits(run: RunConfig, dims: ParallelDims, device_type: str, n_params: int) -> None:
    """The parity reference is the whole model on every rank, by nature: refuse what cannot fit."""
    if not run.probes.parity.enabled or run.mode != "train":
        return
    need = n_params * REFERENCE_BYTES_PER_PARAM
    if device_type == "cuda":
        if not torch.cuda.is_available():  # a run checked for GPUs elsewhere (mode=plan): theirs are unknown here
            return
        have, where = torch.cuda.get_device_properties(0).total_memory, "one GPU's memory"
    else:
        need *= dims.world_size  # every rank's reference shares this host
        have, where = _host_available(), f"this host's available memory, for {dims.world_size} ranks"
    if have is not None and need > have:
        raise ConfigError(
            f"probes.parity.enabled=true: the parity reference holds the whole model ({n_params / 1e9:.2f}B parameters) "
            f"on every rank, {need / 2**30:.0f} GiB with its gradients and optimizer state, more than {where} "
            f"({have / 2**30:.0f} GiB); allowed: probes.parity.enabled=false"
        )


def _host_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def _check_accum(run: RunConfig, dims: ParallelDims) -> None:
    a = run.train.accum
    if a.sync == "reduce_scatter_only" and not (run.mesh.engine == "fsdp2" and dims.hsdp_enabled):
        raise ConfigError(
            "train.accum.sync=reduce_scatter_only: needs HSDP with FSDP2 (mesh.engine=fsdp2, mesh.dp_replicate>1 "
            f"and mesh.dp_shard>1; here engine={run.mesh.engine}, dp_replicate={dims.dp_replicate}, "
            f"dp_shard={dims.dp_shard}); allowed otherwise: every, last"
        )
    for key, value, default in (("reshard_after_backward", a.reshard_after_backward, True), ("explicit_unshard", a.explicit_unshard, False)):
        if value != default and run.mesh.engine != "fsdp2":
            raise ConfigError(f"train.accum.{key}={str(value).lower()}: only FSDP2 has it; mesh.engine={run.mesh.engine}")


# The engines each fsdp.* knob acts on; any other value than the default with another engine is refused.
ENGINE_KNOBS = {
    "reshard_after_forward": ("fsdp2", "fsdp1"),
    "param_dtype": ("fsdp2", "fsdp1"),
    "reduce_dtype": ("fsdp2", "fsdp1"),
    "cpu_offload": ("fsdp2", "fsdp1"),
    "forward_prefetch": ("fsdp2", "fsdp1"),
    "backward_prefetch": ("fsdp2",),
    "cast_forward_inputs": ("fsdp2",),
    "post_optim_event": ("fsdp2",),
    "cast_after_sharding": ("fsdp2",),
    "sharding_strategy": ("fsdp1",),
    "use_orig_params": ("fsdp1",),
    "backward_prefetch_policy": ("fsdp1",),
}
HYBRID = ("hybrid_shard", "hybrid_shard_zero2")


def _show(value) -> str:
    """A value as it is written in an override."""
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else str(value)


def _check_engine(run: RunConfig, dims: ParallelDims, device_type: str) -> None:
    engine, f = run.mesh.engine, run.fsdp
    defaults = FSDPConfig()
    for key, engines in ENGINE_KNOBS.items():
        value = getattr(f, key)
        if engine not in engines and value != getattr(defaults, key):
            raise ConfigError(f"fsdp.{key}={_show(value)}: applies to mesh.engine={'|'.join(engines)}, not mesh.engine={engine}")
    if engine == "fsdp1":
        _check_fsdp1(run, dims, device_type)


def _check_fsdp1(run: RunConfig, dims: ParallelDims, device_type: str) -> None:
    f, strategy = run.fsdp, run.fsdp.sharding_strategy
    for key in ("pp", "tp"):
        if getattr(dims, key) > 1:
            raise ConfigError(f"mesh.{key}={getattr(dims, key)} with mesh.engine=fsdp1: fsdp1 runs on data-parallel meshes only; allowed: mesh.engine=fsdp2")
    if not isinstance(f.reshard_after_forward, bool):
        raise ConfigError(f"fsdp.reshard_after_forward={f.reshard_after_forward} with mesh.engine=fsdp1: allowed are true, false")
    if not f.reshard_after_forward and strategy in ("full_shard", "hybrid_shard"):
        raise ConfigError(
            f"fsdp.reshard_after_forward=false with fsdp.sharding_strategy={strategy}: {strategy} reshards after "
            "forward; allowed: sharding_strategy=auto|shard_grad_op|hybrid_shard_zero2|no_shard"
        )
    if f.forward_prefetch > 1:
        raise ConfigError(f"fsdp.forward_prefetch={f.forward_prefetch} with mesh.engine=fsdp1: fsdp1 prefetches one unit; allowed: 0, 1")
    if strategy in HYBRID and dims.dp_replicate == 1:
        raise ConfigError(f"fsdp.sharding_strategy={strategy}: needs mesh.dp_replicate > 1 (e.g. mesh=hsdp), got mesh.dp_replicate=1")
    if strategy not in HYBRID + ("auto",) and dims.dp_replicate > 1:
        raise ConfigError(
            f"fsdp.sharding_strategy={strategy} with mesh.dp_replicate={dims.dp_replicate}: a replicated mesh "
            "takes auto, hybrid_shard or hybrid_shard_zero2"
        )
    if dims.dp_replicate > 1 and dims.dp_shard == 1:
        # FSDP1 turns a 1-rank shard group into NO_SHARD over that group: the replicas would never sync.
        raise ConfigError(
            f"mesh.dp_shard=1 with mesh.dp_replicate={dims.dp_replicate} and mesh.engine=fsdp1: fsdp1 cannot "
            "replicate without sharding; allowed: mesh.dp_shard >= 2, or mesh.engine=fsdp2|ddp"
        )
    if f.cpu_offload and device_type == "cpu":
        raise ConfigError("fsdp.cpu_offload=true with mesh.engine=fsdp1 on CPU: FSDP1's CPUOffload needs an accelerator; allowed: false")
    if run.model.compile and not f.use_orig_params:
        raise ConfigError("model.compile=true with mesh.engine=fsdp1: needs fsdp.use_orig_params=true")


def _check_fsdp(run: RunConfig, dims: ParallelDims, device_type: str, spec: ModelSpec) -> None:
    _check_engine(run, dims, device_type)
    f = run.fsdp
    raf = f.reshard_after_forward
    if not isinstance(raf, bool):
        if not isinstance(raf, int) or raf < 2 or dims.dp_shard % raf:
            raise ConfigError(
                f"fsdp.reshard_after_forward={raf!r}: allowed are true, false, or an int >= 2 dividing "
                f"mesh.dp_shard={dims.dp_shard}"
            )
    if device_type == "cpu":
        for key in ("param_dtype", "reduce_dtype"):
            if getattr(f, key) == "float16":
                raise ConfigError(f"fsdp.{key}=float16: not supported on CPU; allowed here: float32, bfloat16, null")
    if run.wrap.group > 1 and run.mesh.engine != "fsdp2":
        raise ConfigError(
            f"wrap.group={run.wrap.group} with mesh.engine={run.mesh.engine}: only fully_shard shards several modules "
            "as one unit; allowed: 1, or mesh.engine=fsdp2"
        )
    if run.wrap.policy == "linear" and spec.tied(run.model):
        raise ConfigError(
            f"wrap.policy=linear with {spec.tied_key}=true: the tied weight would sit in two FSDP units; "
            "allowed: wrap.policy=block|root|size"
        )


def _with(capability: str) -> str:
    """The model families that have `capability` (a ModelSpec field)."""
    return ", ".join(sorted(name for name, spec in SPECS.items() if getattr(spec, capability)))


def _check_tp(run: RunConfig, dims: ParallelDims, spec: ModelSpec) -> None:
    tp, model = dims.tp, run.model
    if not dims.tp_enabled:
        return
    if run.mesh.engine != "fsdp2":
        raise ConfigError(f"mesh.engine={run.mesh.engine} with mesh.tp={tp}: tensor parallelism composes with mesh.engine=fsdp2 only")
    if spec.tp_plan is None:
        raise ConfigError(f"mesh.tp={tp}: model.name={model.name} has no tensor-parallel plan; allowed: {_with('tp_plan')}")
    if spec.tied(model):
        raise ConfigError(
            f"{spec.tied_key}=true with mesh.tp={tp}: the embedding and the output would each distribute the "
            f"shared weight, untying it; allowed: {spec.tied_key}=false"
        )
    if run.mesh.sequence_parallel:
        if not spec.sequence_parallel:
            raise ConfigError(f"mesh.sequence_parallel=true: model.name={model.name} has no sequence-parallel plan; allowed with model.name={_with('sequence_parallel')}")
        if run.train.seq_len % tp:
            raise ConfigError(f"mesh.tp={tp} with mesh.sequence_parallel=true: must divide train.seq_len={run.train.seq_len}")


def _check_pp(run: RunConfig, dims: ParallelDims, spec: ModelSpec, built) -> None:
    pp, model, m, n_mb = dims.pp, run.model, run.mesh, run.train.microbatches
    if not dims.pp_enabled:
        return
    if m.engine != "fsdp2":
        raise ConfigError(f"mesh.engine={m.engine} with mesh.pp={pp}: pipeline parallelism composes with mesh.engine=fsdp2 only")
    if spec.pipeline_stage is None:
        raise ConfigError(f"mesh.pp={pp}: model.name={model.name} cannot be split into stages; allowed: {_with('pipeline_stage')}")
    if spec.tied(model):
        raise ConfigError(f"{spec.tied_key}=true with mesh.pp={pp}: the first and last stages would share a weight; allowed: model.tie_embeddings=false")
    if run.probes.comm.enabled:
        raise ConfigError(
            f"probes.comm.enabled=true with mesh.pp={pp}: CommDebugMode's autograd hooks cannot follow a pipeline "
            "schedule; allowed: probes.comm.enabled=false"
        )
    a = run.train.accum
    if (a.sync, a.reshard_after_backward, a.explicit_unshard) != ("every", True, False):
        raise ConfigError(
            f"train.accum.sync={a.sync}, reshard_after_backward={str(a.reshard_after_backward).lower()}, "
            f"explicit_unshard={str(a.explicit_unshard).lower()} with mesh.pp={pp}: the pipeline schedule sets "
            "gradient sync and resharding itself (it reduces after the last microbatch); allowed: the defaults"
        )
    per_rank = stages_per_rank(m)
    multi = m.pp_schedule in MULTI_STAGE_SCHEDULES
    if multi and per_rank < 2:
        raise ConfigError(f"mesh.pp_stages_per_rank={per_rank}: mesh.pp_schedule={m.pp_schedule} needs >= 2 stages per rank")
    if not multi and per_rank != 1:
        raise ConfigError(
            f"mesh.pp_stages_per_rank={per_rank}: mesh.pp_schedule={m.pp_schedule} runs one stage per rank; "
            "allowed: 1, null, or mesh.pp_schedule=interleaved_1f1b"
        )
    if len(built.blocks) % (pp * per_rank):
        raise ConfigError(
            f"model.n_layers={len(built.blocks)}: must be a multiple of the pipeline stages, "
            f"mesh.pp={pp} x {per_rank} stages per rank (mesh.pp_stages_per_rank) = {pp * per_rank}"
        )
    if m.pp_schedule == "1f1b" and n_mb < pp:
        raise ConfigError(f"train.microbatches={n_mb}: mesh.pp_schedule=1f1b needs >= mesh.pp={pp} microbatches")
    rounds = max(1, n_mb // pp)
    if multi and n_mb % rounds:
        raise ConfigError(
            f"train.microbatches={n_mb}: mesh.pp_schedule={m.pp_schedule} needs a multiple of its rounds, "
            f"max(1, {n_mb} // mesh.pp={pp}) = {rounds}"
        )


def _check_module_calls(run: RunConfig, dims: ParallelDims, device_type: str, spec: ModelSpec, built) -> None:
    """Settings that call the model's modules in other ways than one forward of the whole model."""
    model, t, f = run.model, run.train, run.fsdp
    n_blocks = len(built.blocks)
    layer_order = getattr(model, "layer_order", None)  # a field of the families whose forward follows it
    if layer_order is not None:
        if not layer_order or not all(0 <= i < n_blocks for i in layer_order):
            raise ConfigError(f"model.layer_order={layer_order}: block indices in 0..{n_blocks - 1} (model.n_layers={n_blocks}), at least one")
        if run.probes.comm.enabled and len(set(layer_order)) < len(layer_order):
            # CommDebugMode's module tracker loses its place when a module's forward runs a second time (IndexError).
            raise ConfigError(f"probes.comm.enabled=true with model.layer_order={layer_order}: CommDebugMode cannot follow a block called twice; allowed: probes.comm.enabled=false")
    if t.standalone_layer is not None:
        if not spec.standalone_block:
            raise ConfigError(f"train.standalone_layer={t.standalone_layer}: needs a block that takes the model's inputs and returns logits; allowed with model.name={_with('standalone_block')}")
        if not 0 <= t.standalone_layer < n_blocks:
            raise ConfigError(f"train.standalone_layer={t.standalone_layer}: a block index in 0..{n_blocks - 1} (model.n_layers={n_blocks})")
        if run.mesh.engine == "fsdp1":
            raise ConfigError(f"train.standalone_layer={t.standalone_layer} with mesh.engine=fsdp1: an inner FSDP1 unit cannot run alone; allowed: mesh.engine=fsdp2|ddp")
    if run.wrap.group > 1:
        for key, value in (("model.layer_order", layer_order), ("train.standalone_layer", t.standalone_layer)):
            if value is not None:
                # A group is gathered once for its modules' forwards in order; a block run again or alone is not.
                raise ConfigError(f"{key}={_show(value)} with wrap.group={run.wrap.group}: grouped units run each block once, in order; allowed: wrap.group=1")
    if dims.pp_enabled:
        for key, value in (("model.layer_order", layer_order), ("train.standalone_layer", t.standalone_layer),
                           ("fsdp.cast_after_sharding", f.cast_after_sharding), ("fsdp.post_optim_event", f.post_optim_event or None)):
            if value is not None:
                raise ConfigError(f"{key}={_show(value)} with mesh.pp={dims.pp}: pipeline stages run the blocks in order, once, and own their optimizer hooks; allowed with mesh.pp=1")
    if f.cast_after_sharding == "float16" and device_type == "cpu":
        raise ConfigError("fsdp.cast_after_sharding=float16: not supported on CPU; allowed here: float64, float32, bfloat16, null")


def _check_ac(run: RunConfig, spec: ModelSpec) -> None:
    ac = run.ac
    if ac.impl == "manual" and ac.mode != "none" and not spec.manual_ac:
        raise ConfigError(
            f"ac.impl=manual with model.name={run.model.name}: its forward does not call its blocks through "
            "fsdp_lab.models.blocks.call_block; allowed: ac.impl=composable|utils|wrapper|outer_wrapper"
        )
    if ac.impl == "outer_wrapper" and ac.mode != "none" and run.mesh.engine == "ddp":
        raise ConfigError(
            "ac.impl=outer_wrapper with mesh.engine=ddp: it wraps the blocks FSDP made units of, and DDP makes none; "
            "allowed: ac.impl=composable|utils|wrapper|manual, or mesh.engine=fsdp2|fsdp1"
        )
    if not ac.reentrant:
        return
    if ac.impl == "composable":
        raise ConfigError("ac.reentrant=true: the composable checkpoint is non-reentrant only; allowed with ac.impl=utils|wrapper|outer_wrapper|manual")
    if ac.mode not in ("full", "selective") or (ac.mode == "selective" and ac.selective == "op"):
        raise ConfigError(
            f"ac.reentrant=true: only checkpointing that recomputes whole blocks has a reentrant variant "
            f"(ac=full, or ac=selective with ac.selective=layer), not ac.mode={ac.mode}"
            + (f" with ac.selective={ac.selective}" if ac.mode == "selective" else "")
        )


def _check_freeze(run: RunConfig, model) -> None:
    pattern = run.model.freeze
    if pattern is None:
        return
    try:
        re.compile(pattern)
    except re.error as e:
        raise ConfigError(f"model.freeze={pattern}: not a regular expression ({e})") from None
    names, frozen = [n for n, _ in model.named_parameters()], frozen_names(model, pattern)
    if not frozen or len(frozen) == len(names):
        raise ConfigError(
            f"model.freeze={pattern}: matches {len(frozen)} of the {len(names)} parameters of model.name={run.model.name}; "
            f"allowed: a regex matching some but not all of {', '.join(names[:4])}, ..."
        )
    if run.probes.memory.tracker == "module":
        # torch's (FSDP)MemTracker registers a gradient hook on every parameter, which a frozen one refuses.
        raise ConfigError(
            f"model.freeze={pattern} with probes.memory.tracker=module: torch's module tracker cannot follow frozen "
            "parameters; allowed: probes.memory.tracker=none (the per-phase probe works)"
        )
    if run.mesh.engine == "fsdp1" and not run.fsdp.use_orig_params:
        mixed = mixed_units(model, wrap_units(model, run.wrap), pattern)
        if mixed:
            raise ConfigError(
                f"model.freeze={pattern} with mesh.engine=fsdp1 and fsdp.use_orig_params=false: FSDP units "
                f"{', '.join(mixed)} mix frozen and trainable parameters in one flat parameter; allowed: "
                "fsdp.use_orig_params=true, a wrap.policy giving frozen parameters their own units (e.g. linear), "
                "or a pattern freezing whole units"
            )


def _check_checkpoint(run: RunConfig) -> None:
    c = run.checkpoint
    if c.kind == "dcp" and run.mesh.engine == "fsdp1" and run.ac.mode != "none" and run.ac.impl in ("wrapper", "outer_wrapper"):
        # torch's set_state_dict looks FSDP1's parameters up under their checkpoint_wrapper names
        # (KeyError on resume): a checkpoint that could not be loaded is not written at all.
        raise ConfigError(
            f"checkpoint.kind=dcp with mesh.engine=fsdp1 and ac.impl={run.ac.impl}: torch cannot load FSDP1 "
            "state through checkpoint wrappers; allowed: ac.impl=composable, utils or manual, or mesh.engine=fsdp2"
        )
    if c.resume not in (None, "auto"):
        try:
            check_compatible(Path(c.resume), verify(Path(c.resume)), run)
        except CheckpointError as e:
            raise ConfigError(f"checkpoint.resume={c.resume}: {e.reason}; allowed: auto, null, or a complete checkpoint") from None
