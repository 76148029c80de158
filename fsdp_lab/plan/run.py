"""mode=plan: rank the layouts of plan.gpus GPUs for this model by predicted tokens/s, print the table,
write plan.json (each candidate with its overrides as a ready command line) and, with plan.validate=K,
run the best K here and put the measured figures beside the predictions."""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

from fsdp_lab.config import ConfigError, PlanConfig, RunConfig
from fsdp_lab.mesh import MESH_DIM_NAMES
from fsdp_lab.plan.device import plan_device
from fsdp_lab.plan.fits import needed_mib, rule
from fsdp_lab.plan.predict import Predictor
from fsdp_lab.plan.search import Candidate, rank
from fsdp_lab.probes.parity_probe import reference_bytes
from fsdp_lab.sinks.files import write_json_atomic, write_summary

PLAN_FILE = "plan.json"
SUFFIX = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}
# Overrides of the plan itself, or of what each candidate sets: left out of the candidates' command lines.
OWN_KEYS = re.compile(rf"^\+?(mode=|plan\.|mesh\.({'|'.join(MESH_DIM_NAMES)}|world_size)=|ac=|ac\.mode=|train\.(batch_size|global_batch_size|microbatches)=|fsdp\.reshard_after_forward=|model\.compile=|wrap\.group=)")


def global_batch_tokens(value) -> int | None:
    """4M -> 4 x 2**20 tokens (K, M, G are binary, as batch sizes are); an int as is; None stays None."""
    if value is None or isinstance(value, int):
        return value
    m = re.fullmatch(r"(\d+)([KMG]?)", str(value).strip().upper())
    if not m:
        raise ConfigError(f"plan.global_batch_tokens={value}: an integer, or one with a K, M or G suffix (4M)")
    return int(m.group(1)) * SUFFIX[m.group(2)]


def check_plan(run: RunConfig) -> None:
    """Plan inputs the schema cannot check, refused before anything runs."""
    p = run.plan
    if p.gpus > p.gpus_per_node and p.gpus % p.gpus_per_node:
        raise ConfigError(f"plan.gpus={p.gpus}: must be at most or a multiple of plan.gpus_per_node={p.gpus_per_node} (whole nodes)")
    tokens = global_batch_tokens(p.global_batch_tokens)
    if tokens is not None and tokens % run.train.seq_len:
        raise ConfigError(f"plan.global_batch_tokens={p.global_batch_tokens}: must be a multiple of train.seq_len={run.train.seq_len}")
    if p.validate and p.validate > p.top:
        raise ConfigError(f"plan.validate={p.validate}: at most plan.top={p.top} candidates")
    plan_device(p.device)  # auto: refused here where no GPU with a table is in hand
    from fsdp_lab.plan.trace import model_facts

    model_facts(run)  # a model without blocks is refused before anything runs


def gpus_per_node(p: PlanConfig) -> int:
    """The GPUs of one planned node: fewer GPUs than plan.gpus_per_node are one node of plan.gpus
    (4 GPUs of an 8-GPU node's size plan as the 4-GPU box they are)."""
    return min(p.gpus, p.gpus_per_node)


def samples_per_step(run: RunConfig, tokens_per_sample: int) -> int:
    tokens = global_batch_tokens(run.plan.global_batch_tokens)
    return tokens // tokens_per_sample if tokens is not None else run.train.batch_size * run.plan.gpus


def plan(run: RunConfig, predictor: Predictor | None = None) -> tuple[list[Candidate], dict]:
    """Every candidate, ranked, and what the plan is for. A predictor given keeps the traces it took."""
    predictor = predictor or Predictor(run, plan_device(run.plan.device, run.plan.inter_node_gbps), gpus_per_node(run.plan))
    facts, device = predictor.facts, predictor.device
    samples = samples_per_step(run, facts.tokens_per_sample)
    candidates = rank(run, predictor, samples, facts.flops_per_token)
    header = {"gpus": run.plan.gpus, "gpus_per_node": gpus_per_node(run.plan), "device": device.name,
              "device_source": device.table["source"], "samples_per_step": samples,
              "tokens_per_step": samples * facts.tokens_per_sample,
              "params": facts.block_params + facts.other_params, "blocks": facts.layers,
              "fits_rule": rule(run, device.memory_bytes), "memory_margin": run.plan.memory_margin,
              "inter_node_gbps": device.link_gbps, "inter_node_source": device.link_source,
              "matmuls": matmul_pricing(device), "float8": float8_pricing(facts.float8_share, device),
              "parity": parity_note(run, facts.block_params + facts.other_params, device.memory_bytes)}
    return candidates, header


PARITY_OFF = "probes.parity.enabled=false"


def parity_note(run: RunConfig, params: int, memory_bytes: float) -> str | None:
    """Why the candidates' command lines turn the parity reference off (None: they leave it as set)."""
    need = reference_bytes(params)
    if not run.probes.parity.enabled or need <= memory_bytes:
        return None
    return (f"parity: the reference holds the whole model on every rank ({need / 2**30:.0f} GiB with its gradients and "
            f"optimizer state), more than one GPU's {memory_bytes / 2**30:.0f} GiB: the command lines add {PARITY_OFF}")


def matmul_pricing(device) -> str:
    """At what rate the plan priced matmuls: the table's bursts, or the share of them a GPU holds for
    seconds under its power limit, where that was measured."""
    fraction = device.sustained_matmul_fraction
    if fraction == 1.0:
        return "matmuls: at the table's burst rates (the rate held for seconds, under the power limit, not measured here)"
    return f"matmuls: at {fraction:g}x the table's burst rates (the rate held for seconds, under the power limit, as measured)"


def float8_pricing(share: float, device) -> str | None:
    """How the plan priced float8 matmuls (None without float8)."""
    if not share:
        return None
    ratio = device.float8_matmul_ratio
    how = f"at {ratio:g}x bf16's time (the table's measured ratio)" if ratio else "as bf16 (the table has no float8 measurement)"
    return f"float8: {share:.0%} of the blocks' matmuls priced {how}"


def command_line(user_overrides: list[str], candidate: Candidate, header: dict) -> str:
    kept = [o for o in user_overrides if not OWN_KEYS.match(o)]
    parity = [PARITY_OFF] if header.get("parity") else []
    return " ".join(["python -m fsdp_lab", *map(shlex.quote, kept + candidate.row()["overrides"] + parity)])


def render(candidates: list[Candidate], header: dict, top: int, measured: dict[int, dict] | None = None) -> str:
    lines = [f"Plan: {header['gpus']} x {header['device']} ({header['gpus_per_node']} per node), "
             f"{header['params'] / 1e6:.0f}M params in {header['blocks']} blocks, {header['tokens_per_step']:,} tokens per step",
             f"inter-node link {header['inter_node_gbps']:g} GB/s per GPU ({header['inter_node_source']}); {header['fits_rule']}",
             *(header[note] for note in ("matmuls", "float8", "parity") if header.get(note)),
             f"{'#':>3} {'pp':>2} {'rep':>3} {'shard':>5} {'tp':>2} {'ac':>4} {'mb':>3} {'reshard':>7} {'cmp':>3} {'grp':>3} {'peak GiB':>8} "
             f"{'step ms':>8} {'tok/s/GPU':>9} {'MFU':>5} {'fits':>4}" + ("  measured ms  error  peak GiB  runs" if measured else "")]
    for i, c in enumerate(candidates[:top]):
        lay, p = c.layout, c.prediction
        line = (f"{i + 1:>3} {lay.pp:>2} {lay.dp_replicate:>3} {lay.dp_shard:>5} {lay.tp:>2} {lay.ac:>4} {lay.microbatches:>3} "
                f"{str(lay.reshard).lower():>7} {'yes' if lay.compile else 'no':>3} {lay.wrap_group:>3} {p['peak_mib'] / 1024:>8.1f} {p['step_time_s'] * 1e3:>8.1f} "
                f"{c.tokens_per_s:>9.0f} {c.mfu:>5.2f} {'yes' if c.fits else 'NO':>4}" + (" host-bound" if p["host_bound"] else "")
                + f" ({p['memory_from']})")
        m = (measured or {}).get(i)
        if m:
            line += _measured(m)
        lines.append(line)
    fitting = sum(c.fits for c in candidates)
    lines.append(f"{len(candidates)} candidates, {fitting} fit in memory")
    return "\n".join(lines)


def _measured(m: dict) -> str:
    """A validated candidate's columns: a figure missing (a run that measured no peak) shows n/a."""
    if "step_time_s" not in m:
        return f"  failed: {m.get('error')}"
    peak = f"{m['peak_mib'] / 1024:>8.1f}" if m.get("peak_mib") is not None else f"{'n/a':>8}"
    runs = f"{m.get('runs', 1) - m.get('failed_runs', 0)}/{m.get('runs', 1)}"
    failed = f"  failed: {m['error']}" if m.get("error") else ""
    return f"  {m['step_time_s'] * 1e3:>9.1f} {m['step_time_error']:+6.1%} {peak}  {runs:>4}{failed}"


def run_plan(run: RunConfig, run_dir: Path, user_overrides: list[str]) -> None:
    candidates, header = plan(run)
    rows = [{**c.row(), "command": command_line(user_overrides, c, header)} for c in candidates]
    best = rows[0] if candidates and candidates[0].fits else None
    _write(run, run_dir, header, rows, best)
    print(render(candidates, header, run.plan.top), flush=True)
    if run.plan.validate:  # the table is written and printed first: a validation that fails loses nothing
        from fsdp_lab.plan.validate_runs import validate

        measured = validate(candidates[: run.plan.validate], rows, user_overrides, run_dir, run.plan.validate_repeats,
                            written=lambda: _write(run, run_dir, header, rows, best))
        print(render(candidates, header, run.plan.top, measured), flush=True)
    print(f"plan: best {best['command']}" if best else nothing_fits(run, candidates, header), flush=True)


def nothing_fits(run: RunConfig, candidates: list[Candidate], header: dict) -> str:
    """The plan's last line where no candidate fits: the one nearest to fitting and what would lower
    every candidate's memory (the step's samples are spread over at most plan.max_microbatches)."""
    if not candidates:
        return "plan: no layout of these GPUs is accepted for this model"
    least = min(candidates, key=lambda c: c.prediction["peak_mib"])
    lay, peak = least.layout, least.prediction["peak_mib"]
    bf16 = "" if run.fsdp.param_dtype in ("bfloat16", "float16") else ", bfloat16 parameters (fsdp.param_dtype=bfloat16)"
    return (f"plan: no candidate fits in memory; the least, {needed_mib(peak, run) / 1024:.1f} GiB by the fits rule, is pp {lay.pp} × "
            f"dp {lay.dp_replicate * lay.dp_shard} × tp {lay.tp}, ac={lay.ac}, {lay.microbatches} microbatches of {lay.microbatch_size} "
            f"samples; lower it with more microbatches (plan.max_microbatches={run.plan.max_microbatches}), fewer tokens a step "
            f"(plan.global_batch_tokens, {header['tokens_per_step']:,} now){bf16}, or more GPUs")


def _write(run: RunConfig, run_dir: Path, header: dict, rows: list[dict], best: dict | None) -> None:
    write_json_atomic(run_dir / PLAN_FILE, {**header, "candidates": rows})
    write_summary(run_dir, {"status": "ok", "error": None, "mode": "plan", "steps": 0, "world_size": run.plan.gpus,
                            "device": header["device"], "best": best})


def best_fitting_layout(run: RunConfig, gpus: int, device: str, gpus_per_node: int | None = None) -> Candidate | None:
    """The fastest candidate for `run`'s model, batch and settings on `gpus` GPUs of `device` (a table's
    name or auto) that fits by the rule of plan/fits.py, None where none does: `candidate.layout`, and
    `candidate.row()["overrides"]` the overrides that run it. ConfigError for what mode=plan refuses."""
    per_node = min(gpus, gpus_per_node or run.plan.gpus_per_node)
    planned = dataclasses.replace(run, mode="plan", plan=dataclasses.replace(run.plan, gpus=gpus, device=device, gpus_per_node=per_node))
    check_plan(planned)
    candidates, _ = plan(planned)
    return candidates[0] if candidates and candidates[0].fits else None
