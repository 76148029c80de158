"""layout=auto: before any rank starts, the run asks the plan (fsdp_lab/plan/) for the GPUs it will
use and takes the fastest candidate that fits and agrees with every key set on the command line; the
rest of the layout (mesh degrees, AC, microbatches, resharding, and whatever else the plan's
candidates set) comes from that candidate. The run prints what it chose with the predicted step time
and peak, and summary.json's `layout` records both beside the measured figures.

Where no device table describes the GPUs (CPU, or a GPU the plan has no table for) it says so in one
line and keeps the config's layout; `plan.device=NAME` (and `plan.gpus=N`) on the command line name
the table (and the GPUs) to plan for instead. A sweep's jobs each choose for their own overrides. A
run with the same inputs as an earlier one takes that run's choice without planning (layout_cache.py)."""

from __future__ import annotations

import dataclasses
import os
import time
from contextlib import nullcontext

import torch
from omegaconf import DictConfig

from fsdp_lab.compose import CONF_DIR, to_run_config
from fsdp_lab.config import RunConfig
from fsdp_lab.dist import is_rank_process
from fsdp_lab.layout_cache import choice_key, keep_choice, kept_choice

# The device tables (fsdp_lab/plan/devices/) by a word of the GPU's name, and the least memory (GiB)
# a GPU of that name has for the table to describe it.
TABLES = (("H200", "h200", 130), ("H100", "h100-80gb", 75))


def device_table(gpu_name: str | None, memory_gib: float) -> str | None:
    """The plan's device table for a GPU, by its name; None for none (CPU) or one without a table."""
    if gpu_name is None:
        return None
    return next((table for word, table, least in TABLES if word in gpu_name and memory_gib >= least), None)


def explicit_keys(task_overrides: list[str]) -> dict[str, str]:
    """key -> value of the command line's overrides (`+key=`, `++key=` as `key=`)."""
    out = {}
    for o in task_overrides:
        key, sep, value = o.lstrip("+~").partition("=")
        if sep:
            out[key] = value
    return out


# Keys the command line may spell otherwise than the plan's candidates do.
ALIASES = {"ac.mode": "ac"}


def pinned_keys(cfg: DictConfig, explicit: dict[str, str]) -> dict[str, str]:
    """What layout=auto keeps: the keys set on the command line, and every key of a config group
    chosen there as its preset composed it (mesh=hsdp pins its degrees; a -1 that fills the world pins nothing)."""
    out = {ALIASES.get(k, k): v for k, v in explicit.items()}
    for group in (k for k in explicit if "." not in k and isinstance(cfg.get(k), DictConfig)):
        for sub, value in cfg[group].items():
            if isinstance(value, (bool, int, str)) and value != -1:
                out.setdefault(f"{group}.{sub}", str(value).lower() if isinstance(value, bool) else str(value))
    return out


def _agrees(overrides: list[str], pinned: dict[str, str]) -> bool:
    """A candidate's overrides set no pinned key otherwise (true/True alike)."""
    return all(pinned.get(k, v).lower() == v.lower() for k, v in (o.split("=", 1) for o in overrides))


def planned(run: RunConfig, device: str, gpus: int) -> list:
    """The plan's candidates for this run on `gpus` GPUs of `device` (one node), ranked: the one call
    into fsdp_lab/plan/. The tokens per step are the run's (train.global_batch_size when set)."""
    from fsdp_lab.plan.run import plan

    tokens = run.train.global_batch_size * run.train.seq_len if run.train.global_batch_size else run.plan.global_batch_tokens
    return plan(dataclasses.replace(run, mode="plan", plan=dataclasses.replace(
        run.plan, gpus=gpus, gpus_per_node=gpus, device=device, global_batch_tokens=tokens)))[0]


def pick(candidates: list, pinned: dict[str, str]) -> dict | None:
    """The first (fastest) fitting candidate that agrees with `pinned` (pinned_keys): {overrides
    (those not pinned), kept (the pinned ones it sets too), plan_rank, candidates,
    predicted{step_time_s, peak_mib, tokens_per_s_per_gpu}}; None where none does."""
    for rank, c in enumerate(candidates, 1):
        row = c.row()
        if c.fits and _agrees(row["overrides"], pinned):
            return {
                "overrides": [o for o in row["overrides"] if o.split("=", 1)[0] not in pinned],
                "kept": [f"{k}={v}" for k, v in pinned.items() if any(o.startswith(k + "=") for o in row["overrides"])],
                "plan_rank": rank, "candidates": len(candidates),
                "predicted": {"step_time_s": row["step_time_s"], "peak_mib": row["peak_mib"],
                              "tokens_per_s_per_gpu": row["tokens_per_s_per_gpu"]},
            }
    return None


def _visible_gpu() -> tuple[str | None, float, int]:
    if not torch.cuda.is_available():
        return None, 0.0, 0
    props = torch.cuda.get_device_properties(0)
    return props.name, props.total_memory / 2**30, torch.cuda.device_count()


def _gpus_of(run: RunConfig, visible: int) -> int:
    from fsdp_lab.validate import requested_world_size

    return int(os.environ["WORLD_SIZE"]) if is_rank_process() else requested_world_size(run.mesh, visible)


def _say(line: str) -> None:
    if os.environ.get("RANK", "0") == "0":  # torchrun's ranks each choose alike; one says so
        print(line, flush=True)


def apply_layout(cfg: DictConfig, task_overrides: list[str]) -> DictConfig:
    """`cfg` as layout=auto leaves it: recomposed with the chosen candidate's overrides, and its
    `layout_auto` record set; unchanged for layout=config and for modes other than train."""
    if cfg.get("layout") != "auto" or cfg.get("mode") != "train":
        return cfg
    run = to_run_config(cfg)
    explicit = explicit_keys(task_overrides)
    name, memory_gib, visible = _visible_gpu()
    # plan.device / plan.gpus on the command line price other GPUs than this machine's (or none).
    table = explicit.get("plan.device") or device_table(name, memory_gib)
    if table is None:
        reason = f"no device table describes {name or 'this machine (no GPU visible)'}"
        _say(f"layout=auto: {reason}; keeping the config's layout")
        return _recorded(cfg, {"mode": "auto", "device": None, "chosen": None, "reason": reason})
    gpus = int(explicit["plan.gpus"]) if "plan.gpus" in explicit else _gpus_of(run, visible)
    start = time.perf_counter()
    pinned = pinned_keys(cfg, explicit)
    key = choice_key(run, table, gpus, pinned)
    chosen = kept_choice(key) if key else None
    from_cache = chosen is not None
    if not from_cache:
        chosen = pick(planned(run, table, gpus), pinned)
        if chosen is not None and key:
            keep_choice(key, chosen)
    plan_s = round(time.perf_counter() - start, 1)  # what choosing added to the run's start
    if chosen is None:
        reason = f"no candidate of the plan for {gpus} x {table} fits and agrees with {' '.join(task_overrides) or 'the config'}"
        _say(f"layout=auto: {reason}; keeping the config's layout")
        return _recorded(cfg, {"mode": "auto", "device": table, "gpus": gpus, "chosen": None, "reason": reason, "plan_s": plan_s})
    p = chosen["predicted"]
    _say(f"layout=auto: {' '.join(chosen['overrides'])} on {gpus} x {table} (plan's #{chosen['plan_rank']} of {chosen['candidates']}"
         + (f", keeping {' '.join(chosen['kept'])}" if chosen["kept"] else "")
         + f"): predicted step {p['step_time_s'] * 1e3:.1f} ms, peak {p['peak_mib'] / 1024:.2f} GiB; "
         + ("the choice an earlier run with the same inputs made (plan.cache=false plans again)" if from_cache else f"planned in {plan_s:g} s"))
    record = {"mode": "auto", "device": table, "gpus": gpus, "chosen": {"overrides": chosen["overrides"], "kept": chosen["kept"]},
              "predicted": p, "plan_s": plan_s, "from_cache": from_cache}
    own = [o for o in task_overrides if not o.lstrip("+~").startswith(("hydra.", "hydra/"))]  # the app's, not the run's
    return _recorded(compose_with(own + chosen["overrides"]), record)


def _recorded(cfg: DictConfig, record: dict) -> DictConfig:
    cfg.layout_auto = record
    return cfg


def compose_with(overrides: list[str]) -> DictConfig:
    """conf/ composed with `overrides`, in the Hydra app that is running or, outside one, on its own."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra


    running = GlobalHydra.instance().is_initialized()
    with nullcontext() if running else initialize_config_dir(CONF_DIR, version_base="1.3"):
        return compose("config", overrides=overrides)
