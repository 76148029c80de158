"""Which fsdp.* knobs each engine (fsdp2, fsdp1, ddp) takes, and the layouts FSDP refuses: checked
before any rank starts."""

from __future__ import annotations

import torch
from torch.distributed.fsdp import FSDPModule

from fsdp_lab.config import ConfigError, FSDPConfig, RunConfig, show
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.models.spec import ModelSpec
from fsdp_lab.parallel.symm_mem import symm_mem_missing


# The engines each fsdp.* knob acts on; any other value than the default with another engine is refused.
ENGINE_KNOBS = {
    "reshard_after_forward": ("fsdp2", "fsdp1"),
    "param_dtype": ("fsdp2", "fsdp1"),
    "reduce_dtype": ("fsdp2", "fsdp1"),
    "cpu_offload": ("fsdp2", "fsdp1"),
    "forward_prefetch": ("fsdp2", "fsdp1"),
    "backward_prefetch": ("fsdp2",),
    "root_backward_prefetch": ("fsdp2",),
    "cast_forward_inputs": ("fsdp2",),
    "post_optim_event": ("fsdp2",),
    "symm_mem": ("fsdp2",),
    "force_sum_reduction": ("fsdp2",),
    "reduce_copy_in": ("fsdp2",),
    "all_gather": ("fsdp2",),
    "cast_after_sharding": ("fsdp2",),
    "sharding_strategy": ("fsdp1",),
    "use_orig_params": ("fsdp1",),
    "backward_prefetch_policy": ("fsdp1",),
}
HYBRID = ("hybrid_shard", "hybrid_shard_zero2")


def check_fsdp(run: RunConfig, dims: ParallelDims, device_type: str, spec: ModelSpec) -> None:
    _check_engine_knobs(run, dims, device_type)
    f = run.fsdp
    raf = f.reshard_after_forward
    if not isinstance(raf, bool):
        if not isinstance(raf, int) or raf < 2 or dims.dp_shard % raf:
            raise ConfigError(
                f"fsdp.reshard_after_forward={raf!r}: allowed are true, false, or an int >= 2 dividing "
                f"mesh.dp_shard={dims.dp_shard}"
            )
    if f.symm_mem and (missing := symm_mem_missing(reduce_scatter=f.force_sum_reduction)):
        raise ConfigError(f"fsdp.symm_mem=true: torch {torch.__version__} lacks {missing}; allowed here: false")
    if f.all_gather == "in_place" and f.symm_mem:
        raise ConfigError("fsdp.all_gather=in_place with fsdp.symm_mem=true: both choose where the all-gather writes "
                          "(symmetric memory or the parameters); allowed: fsdp.all_gather=packed, or fsdp.symm_mem=false")
    if f.force_sum_reduction and not hasattr(FSDPModule, "set_force_sum_reduction_for_comms"):
        raise ConfigError(f"fsdp.force_sum_reduction=true: torch {torch.__version__} lacks "
                          "FSDPModule.set_force_sum_reduction_for_comms; allowed here: false")
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


def _check_engine_knobs(run: RunConfig, dims: ParallelDims, device_type: str) -> None:
    engine, f = run.mesh.engine, run.fsdp
    defaults = FSDPConfig()
    for key, engines in ENGINE_KNOBS.items():
        value = getattr(f, key)
        if engine not in engines and value != getattr(defaults, key):
            raise ConfigError(f"fsdp.{key}={show(value)}: applies to mesh.engine={'|'.join(engines)}, not mesh.engine={engine}")
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
