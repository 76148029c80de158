"""Every name a config gives is resolved on the model built on meta before any rank starts: a
class (`wrap.classes`), a transformers config field (`model.config.<key>`), the module a fault
corrupts on the rank that corrupts it. A name that resolves to nothing is refused with one line
saying what exists instead; otherwise the run would go on as if the key had not been set.
(`model.blocks`, `model.freeze` and `model.build._target_` are resolved where the model is built.)"""

from __future__ import annotations

import copy
import difflib

from torch import nn

from fsdp_lab.config import ConfigError, RunConfig
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.models import model_spec
from fsdp_lab.parallel.pipeline import rank_stage_ids, stage_module, stages_per_rank


def check_names(run: RunConfig, dims: ParallelDims, model: nn.Module) -> None:
    _check_wrap_classes(run, model)
    if run.model.name == "hf":
        _check_hf_fields(run, model)
    if run.fault.kind == "corrupt_grad" and run.fault.kill_rank is not None and dims.pp_enabled:
        _check_module_on_rank(run, dims, model)


def _listed(names, limit: int = 12) -> str:
    names = list(names)
    return ", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def _check_wrap_classes(run: RunConfig, model: nn.Module) -> None:
    w = run.wrap
    shown = f"[{','.join(w.classes)}]"
    if w.classes and w.policy != "classes":
        raise ConfigError(f"wrap.classes={shown} with wrap.policy={w.policy}: only wrap.policy=classes reads it; allowed: wrap.policy=classes, or wrap.classes=[]")
    if w.policy != "classes":
        return
    # Walked only here: mode=plan checks thousands of layouts of one model, most with another policy.
    present = sorted({type(m).__name__ for m in model.modules() if m is not model})
    missing = [name for name in w.classes if name not in present]
    if not w.classes or missing:
        what = "names no class" if not w.classes else f"{', '.join(missing)}: no module of model.name={run.model.name} is of that class"
        raise ConfigError(f"wrap.classes={shown}: {what}; allowed: class names of its modules: {_listed(present)}")


def _check_hf_fields(run: RunConfig, model: nn.Module) -> None:
    """transformers stores an unknown config keyword as an attribute nobody reads: a misspelt
    model.config.<key> would build the default model silently."""
    built = model.inner.config
    default = type(built)()
    # A keyword a config folds into one of its dict fields (llama's rope_theta into rope_parameters) is read.
    folded = [v for v in vars(built).values() if isinstance(v, dict)]
    for key, value in run.model.config.items():
        if hasattr(default, key) or any(key in d and d[key] == value for d in folded):
            continue
        close = difflib.get_close_matches(key, sorted(default.to_dict()), n=3)
        raise ConfigError(
            f"model.config.{key}={value}: {type(built).__name__} has no field {key}, so transformers would ignore it; "
            f"allowed: its fields" + (f", e.g. {', '.join(close)}" if close else f": {_listed(sorted(default.to_dict()))}")
        )


def _check_module_on_rank(run: RunConfig, dims: ParallelDims, model: nn.Module) -> None:
    """With pipeline stages each pp rank holds some layers only: the module corrupted must be on
    the rank that corrupts it (the stage is built on meta as the rank builds it)."""
    f = run.fault
    pp_rank = f.kill_rank // (dims.world_size // dims.pp)  # pp is the outermost mesh dimension
    n_stages = dims.pp * stages_per_rank(run.mesh)
    stage = stage_module(copy.deepcopy(model), model_spec(run.model.name).pipeline_stage,
                         rank_stage_ids(run.mesh, dims.pp, pp_rank), n_stages, model, run.train.seq_len)
    held = [name for name, mod in stage.named_modules() if name and next(mod.parameters(), None) is not None]
    if f.module not in held:
        raise ConfigError(
            f"fault.module={f.module}: not on fault.kill_rank={f.kill_rank}, whose pipeline stage (mesh.pp rank {pp_rank}) "
            f"holds {_listed(held, 6)}; allowed: a module of that stage, or another fault.kill_rank"
        )

