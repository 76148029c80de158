"""Float8 training (torchao): the model's nn.Linear layers swapped for Float8Linear before TP and
FSDP (torchtitan's order), TP styles that cast to float8 before their collectives (tensorwise), and
the weights' scales precomputed after each optimizer step where FSDP2 all-gathers them in float8.

Where the device has no float8 matmul (CPU, GPUs before SM 8.9) torchao emulates it in high
precision with float8 rounding, so CPU runs test the same path the GPUs take; speed only on GPUs."""

from __future__ import annotations

import dataclasses
import logging
import sys

import torch
from torch import nn

from fsdp_lab.config import Float8Config
from fsdp_lab.models.init import takes_place_of

log = logging.getLogger(__name__)

# torch._scaled_mm takes float8 operands whose dimensions are multiples of 16.
FLOAT8_MULTIPLE = 16


def enabled(cfg: Float8Config) -> bool:
    return cfg.recipe != "none"


def skipped(name: str, cfg: Float8Config) -> bool:
    """Whether the linear called `name` stays in high precision (float8.skip)."""
    return any(name == s or name.endswith("." + s) or name.startswith(s + ".") for s in cfg.skip)


def converted_linears(model: nn.Module, cfg: Float8Config) -> dict[str, nn.Linear]:
    """The linears float8.recipe converts, by module name."""
    return {name: m for name, m in model.named_modules() if type(m) is nn.Linear and not skipped(name, cfg)}


def converted_block_share(model: nn.Module, cfg: Float8Config) -> float:
    """The share of the blocks' linear weights, so of their matmul FLOPs, that float8.recipe converts
    (0 without float8): what the plan prices at the device's float8 matmul rate."""
    if not enabled(cfg):
        return 0.0
    in_blocks = {id(m): m.weight.numel() for b in model.blocks for m in b.modules() if type(m) is nn.Linear}
    converted = sum(in_blocks[id(m)] for m in converted_linears(model, cfg).values() if id(m) in in_blocks)
    return converted / sum(in_blocks.values()) if in_blocks else 0.0


def float8_operand(t: torch.Tensor) -> bool:
    """A matmul operand torchao cast to float8 (its training tensor subclass). Its matmul runs inside
    the subclass, out of sight of a dispatch mode above it: the plan's trace records it by this. Where
    torchao was never imported, no such tensor exists (and no import is tried per matmul)."""
    module = sys.modules.get("torchao.float8.float8_training_tensor")
    return module is not None and isinstance(t, module.Float8TrainingTensor)


def emulated(device: torch.device) -> bool:
    """No float8 matmul here: torchao emulates it (and torch.compile cannot take the emulation)."""
    return device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9)


def torchao_config(cfg: Float8Config, emulate: bool):
    from torchao.float8 import Float8LinearConfig

    base = Float8LinearConfig.from_recipe_name(cfg.recipe)
    return dataclasses.replace(base, emulate=emulate, enable_fsdp_float8_all_gather=cfg.fsdp_all_gather)


def apply_float8(model: nn.Module, cfg: Float8Config, device: torch.device) -> None:
    """Swap the linears of `model` (a whole model or a pipeline stage) for torchao's Float8Linear."""
    from torchao.float8 import convert_to_float8_training

    chosen = converted_linears(model, cfg)
    emulate = emulated(device)
    convert_to_float8_training(model, config=torchao_config(cfg, emulate), module_filter_fn=lambda m, name: name in chosen)
    for name, original in chosen.items():
        takes_place_of(model.get_submodule(name), original)
    if cfg.tp_scales == "shard":
        from fsdp_lab.parallel.float8_shard_scales import use_shard_scales

        for name in chosen:
            use_shard_scales(model.get_submodule(name))
    log.info("float8: %s, %d linears converted, fsdp_all_gather=%s, tp_scales=%s%s", cfg.recipe, len(chosen),
             str(cfg.fsdp_all_gather).lower(), cfg.tp_scales, ", emulated (no float8 matmul on this device)" if emulate else "")


def float8_tp_styles(cfg: Float8Config):
    """(colwise, rowwise) style classes for converted linears: tensorwise casts to float8 before TP's
    collectives (torchao's float8 TP styles); rowwise keeps PyTorch's, as torchtitan does."""
    if cfg.recipe != "tensorwise":
        return None
    from torchao.float8.float8_tensor_parallel import Float8ColwiseParallel, Float8RowwiseParallel

    return Float8ColwiseParallel, Float8RowwiseParallel


def float8_plan(module: nn.Module, plan: dict[str, object], cfg: Float8Config) -> dict[str, object]:
    """`plan` (path under `module` -> style) with the styles of converted linears swapped for torchao's
    float8 ones; each keeps the layouts the model's plan gave it. A module whose input enters as one
    DTensor (PrepareModuleInput) and feeds only converted column-wise linears casts that input to
    float8 once on its way in (torchao's PrepareFloat8ModuleInput, as torchtitan): one cast where each
    linear made its own, and with sequence parallelism the all-gather moves float8."""
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel
    from torchao.float8.float8_linear import Float8Linear
    from torchao.float8.float8_tensor_parallel import PrepareFloat8ModuleInput

    styles = float8_tp_styles(cfg)
    if styles is None:
        return plan
    colwise, rowwise = styles
    # torchao's float8 TP styles cast the layer's input or output gradient as the whole DTensor; with
    # shard scales the layer casts its local shards itself, under PyTorch's styles.
    swaps = () if cfg.tp_scales == "shard" else ((ColwiseParallel, colwise), (RowwiseParallel, rowwise))
    out = dict(plan)
    for path, style in plan.items():
        if type(style) is PrepareModuleInput:
            # The module's input feeds its column-wise linears (the row-wise ones take their output):
            # only where each is converted, else a float8 input would reach a high-precision one.
            fed = [module.get_submodule(p) for p, s in plan.items() if p.startswith(path + ".") and isinstance(s, ColwiseParallel)]
            if fed and all(isinstance(m, Float8Linear) for m in fed):
                out[path] = _restyled(style, PrepareFloat8ModuleInput)
            continue
        if not isinstance(module.get_submodule(path), Float8Linear):
            continue
        for plain, f8 in swaps:
            if isinstance(style, plain):
                out[path] = _restyled(style, f8)
    return out


def _restyled(style, cls):
    """A `cls` style with the layouts (and use_local_output) the model's plan gave `style`."""
    swapped = cls()
    vars(swapped).update(vars(style))
    return swapped


def precompute_scales_after_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """float8 all-gather: every float8 weight's scale from one all-reduce of amaxes after each
    optimizer step, instead of one per weight inside the next forward."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    optimizer.register_step_post_hook(lambda opt, args, kwargs: precompute_float8_dynamic_scale_for_fsdp(model))
    log.info("float8: weight scales precomputed after every optimizer.step")


def _tp_split(model: nn.Module, plan) -> dict[str, str]:
    """Module name -> colwise|rowwise under the model's TP plan."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    root_plan, block_plan = plan
    names = {id(m): n for n, m in model.named_modules()}
    placed = dict(root_plan) | {f"{names[id(b)]}.{path}": style for b in model.blocks for path, style in block_plan.items()}
    kinds = {ColwiseParallel: "colwise", RowwiseParallel: "rowwise"}
    return {name: kind for name, style in placed.items() for cls, kind in kinds.items() if isinstance(style, cls)}


def _per_tp_rank(features: int, tp: int) -> list[int]:
    """A split dimension's sizes on the tp ranks that hold some, as DTensor shards it: torch.chunk's."""
    return [len(chunk) for chunk in torch.empty(features, device="meta").chunk(tp)]


def check_float8(run, dims, device_type: str, model: nn.Module, tp_plan) -> None:
    """What float8 training cannot do here, refused in one line before any rank starts. `model` is the
    run's model on meta; `tp_plan` its family's plan when mesh.tp > 1 (else None)."""
    from fsdp_lab.config import ConfigError

    f, engine = run.float8, run.mesh.engine
    if not enabled(f):
        if f.fsdp_all_gather:
            raise ConfigError("float8.fsdp_all_gather=true with float8.recipe=none: there are no float8 weights to gather; allowed: float8.recipe=tensorwise")
        if f.tp_scales == "shard":
            raise ConfigError("float8.tp_scales=shard with float8.recipe=none: there are no float8 casts to scale; allowed: float8.recipe=tensorwise")
        return
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        raise ConfigError(f"float8.recipe={f.recipe}: needs torchao (pip install 'fsdp_lab[float8]'); allowed without it: none") from None
    if engine == "fsdp1":
        raise ConfigError(f"float8.recipe={f.recipe} with mesh.engine=fsdp1: torchao's float8 training composes with fully_shard and DDP; allowed: mesh.engine=fsdp2|ddp")
    if f.tp_scales == "shard" and f.recipe != "tensorwise":
        raise ConfigError(f"float8.tp_scales=shard with float8.recipe={f.recipe}: only tensorwise scales span a whole tensor; allowed: float8.tp_scales=tensor, or float8.recipe=tensorwise")
    if f.fsdp_all_gather and f.recipe != "tensorwise":
        raise ConfigError(f"float8.fsdp_all_gather=true with float8.recipe={f.recipe}: only one scale per tensor can be gathered with its shards; allowed: float8.recipe=tensorwise")
    if f.fsdp_all_gather and engine != "fsdp2":
        raise ConfigError(f"float8.fsdp_all_gather=true with mesh.engine={engine}: only FSDP2 all-gathers weights; allowed: mesh.engine=fsdp2")
    on_emulated = device_type == "cpu" or (device_type == "cuda" and torch.cuda.is_available() and emulated(torch.device("cuda", 0)))
    if run.model.compile and on_emulated:
        raise ConfigError(f"model.compile=true with float8.recipe={f.recipe} on a device without float8 matmuls (CPU, GPUs before SM 8.9): torchao's emulation cannot be compiled; allowed: model.compile=false")
    if device_type == "cpu" and dims.tp_enabled and run.mesh.sequence_parallel and f.recipe == "tensorwise":
        raise ConfigError("mesh.sequence_parallel=true with float8.recipe=tensorwise and mesh.tp>1 on CPU: torchao's float8 TP styles all-gather float8 tensors, which gloo cannot; allowed on CPU: mesh.sequence_parallel=false or float8.recipe=rowwise")
    linears = converted_linears(model, f)
    if not linears:
        raise ConfigError(f"float8.recipe={f.recipe}: no nn.Linear of model.name={run.model.name} is left to convert (float8.skip={f.skip}); allowed: a float8.skip that keeps some, or float8.recipe=none")
    split = _tp_split(model, tp_plan) if dims.tp_enabled and tp_plan is not None else {}
    for name, m in linears.items():
        outs = _per_tp_rank(m.out_features, dims.tp if split.get(name) == "colwise" else 1)
        ins = _per_tp_rank(m.in_features, dims.tp if split.get(name) == "rowwise" else 1)
        unfit = [(i, o) for i in ins for o in outs if i % FLOAT8_MULTIPLE or o % FLOAT8_MULTIPLE]
        if unfit:
            in_f, out_f = unfit[0]
            raise ConfigError(
                f"float8.recipe={f.recipe}: linear {name} is {in_f} -> {out_f} per rank (mesh.tp={dims.tp}); float8 matmuls need both "
                f"multiples of {FLOAT8_MULTIPLE}; allowed: float8.skip=[...,{name.rsplit('.', 1)[-1]}] to keep it in high precision, or other model dims"
            )
        uneven = [o for o in outs if o % dims.dp_shard]
        if f.fsdp_all_gather and uneven:
            out_f = uneven[0]
            raise ConfigError(
                f"float8.fsdp_all_gather=true: linear {name}'s weight has {out_f} rows per tp rank, which do not split over "
                f"mesh.dp_shard={dims.dp_shard} ranks (torchao gathers even shards only); allowed: float8.fsdp_all_gather=false, a dp_shard dividing {out_f}, or float8.skip"
            )
