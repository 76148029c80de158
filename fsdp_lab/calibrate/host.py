"""The host's cost of issuing a step, measured on the device by benchmarks/calibrate_device.py.

A Llama of a planned model's kernel sizes (4 x 2048 tokens, at the two widths of WIDTHS; a vocabulary
of 512 keeps the rest small) runs the lab's own trainer at two depths, eager, with TP and compiled;
each run reports the host's time to issue a step (perf.host_step_s: from the step's start to its
last op, before the loss's sync waits for the GPU), so the GPU's share of the step does not enter.
The host's time per op grows with the kernels' size: a 256-wide model's host-bound steps priced the
host of 150m and 1b models' steps 10-30% short, and one 1536-wide model priced the 150m model's
25-36% over (their host time measured on an H200). The host
times' difference per block, divided by what the plan's trace counts in a block (ops dispatched;
matmul and attention calls), gives seconds per op, the extra per TP matmul (DTensor dispatch,
redistribution) and per compiled block's kernel (model.compile compiles the loss too, so the
compiled runs price it); what is left at depth 2, less the model's other ops, is the step's own host
work (the gradient norm, the optimizer's launch, zero_grad, the probes). A run with two
microbatches prices gradient accumulation: what its second microbatch costs beyond one more
microbatch's ops, per block and for the rest. A run with activation checkpointing prices what AC
adds per block beyond the ops the trace counts (the trace records the recomputed forward's ops in
backward, so those are plain ops already): checkpoint's hooks and saved-tensor bookkeeping;
compiled as well, beyond its compiled kernels. A run with two blocks to an FSDP unit prices FSDP's
host work per collective (the others run one block to a unit: three collectives a block), eager and
compiled. An HF Llama of the same sizes (model=hf) dispatches half as many ops again per block (HF's
RMSNorm, rotary and SwiGLU as PyTorch ops where the lab fuses them), so the two blocks split a
block's host time into a part per op and a part per block (module calls, hooks): what any model's
block costs from the ops its trace counts. Each run's step time
beside its host's gives how much later than rank 0's host the slowest rank's ends a host-bound step
(slowest_host). None of it comes from the configurations the plan is checked against.

The plan reads the fitted widths by fsdp_lab/plan/host.py (host_figures)."""

from __future__ import annotations

import functools
import re
import statistics
from collections import Counter
from dataclasses import dataclass

from fsdp_lab.plan.cost import CALIBRATED_COLLECTIVES_PER_BLOCK
from fsdp_lab.plan.host import kernel_s

# The op count of a block does not depend on its width: the widths only set the kernels' size. On the
# device, a Llama narrower than the 0.2B planned models (768) and one wider than the 1B (2304), heads
# of 128, ffn about 8/3 of the width: their blocks' kernel times bracket the models the plan is checked
# against (benchmarks/plan_accuracy.py: 1024 and 2048 wide). `quick` (calibrate_device.py --quick, a
# CPU) runs the same structure at widths a CPU can train.
WIDTHS = {"device": ({"dim": 768, "heads": 6, "ffn": 2048, "seq": 2048, "batch": 4},
                     {"dim": 2304, "heads": 18, "ffn": 6144, "seq": 2048, "batch": 4}),
          "quick": ({"dim": 128, "heads": 2, "ffn": 256, "seq": 128, "batch": 1},
                    {"dim": 256, "heads": 4, "ffn": 512, "seq": 128, "batch": 1})}
PRECISION = ("train.seq_len={seq}", "fsdp.param_dtype=bfloat16", "fsdp.reduce_dtype=float32")
HOST_MODEL = ("model.dim={dim}", "model.n_layers={layers}", "model.n_heads={heads}", "model.ffn_dim={ffn}", "model.vocab_size=512",
              *PRECISION)
# The same sizes as an HF transformers Llama (the `hf` run): another op mix in a block of the same kernels.
HF_HOST_MODEL = ("model=hf", "model.model_type=llama", "+model.config.hidden_size={dim}", "+model.config.num_hidden_layers={layers}",
                 "+model.config.num_attention_heads={heads}", "+model.config.num_key_value_heads={heads}",
                 "+model.config.intermediate_size={ffn}", "+model.config.vocab_size=512", *PRECISION)
# The median of 30 steps after 10 of warm-up: a host's time wanders by tens of microseconds from
# step to step (scheduling, the allocator), and the figures are differences of two runs.
TIMED = ("train.steps=40", "probes.perf.warmup_steps=10", "probes.parity.enabled=false", "logger=none")
# `quick` checks the script on a CPU, where 44 runs of 40 steps take longer than 25 minutes: a few
# steps, one round.
QUICK_TIMED = ("train.steps=4", "probes.perf.warmup_steps=2", "probes.parity.enabled=false", "logger=none")
DEPTHS = (2, 10)  # 8 blocks apart: the per-block figures divide the runs' noise by 8
# A host's speed moves from run to run by 10-25% (on the H200 machines: two runs of one 1b layout
# issued their steps in 77 and 93 ms): each eager run is timed in 3 rounds, apart in time, and its
# median taken. Compiled runs compile anew each time (a minute for 3 rounds): timed once.
ROUNDS = 3
VARIANTS = {"eager": (), "tp": ("mesh.tp=2",), "compiled": ("model.compile=true",),
            "mb2": ("train.microbatches=2",),  # two microbatches of the eager run's samples (the batch doubles)
            "ac": ("ac=full",),  # every block checkpointed, as the plan's AC candidates run
            "ac compiled": ("ac=full", "model.compile=true"),  # ... and compiled, checkpoint inside the compiled block
            # op-level selective AC: its policy sees every op of a block's forward and of its recompute in
            # Python; on 4xH100 (2026-11-27) a 1b step under it issued in 170 ms where the op count priced 122
            "ac op": ("ac=selective", "ac.selective=op", "ac.every=1"),
            # TP's DTensor at a compiled block's edges, and TP under checkpointing: on 2xH100 (2026-11-26) a
            # TP layout compiled, or eager with every block checkpointed, issued its step in 1.8-2.5x what the
            # eager TP figures alone price
            "tp compiled": ("mesh.tp=2", "model.compile=true"), "tp ac": ("mesh.tp=2", "ac=full"),
            # two blocks to an FSDP unit: the host's work per collective a unit issues, beyond its ops
            # (fsdp_collective_s), eager and compiled; on 4xH100 (2026-11-26) four blocks to a unit
            # issued an eager 1b step in 58 ms against 105 ms at one
            "group2": ("wrap.group=2",), "group2 compiled": ("wrap.group=2", "model.compile=true"),
            # the host model as an HF Llama (HF_HOST_MODEL): in the 4xH100 accuracy set an HF 1b step's host
            # took 1.19x the lab's for 1.5x the ops a block, which one cost per op priced 1.5x
            "hf": ()}
MODELS = {"hf": HF_HOST_MODEL}  # a variant's model where it is not HOST_MODEL


def compiled(variant: str) -> bool:
    """A compiled variant: compiled anew at each run, so timed once, and never host-bound at its block."""
    return "model.compile=true" in VARIANTS[variant]


def widths(quick: bool = False) -> tuple[dict, ...]:
    return WIDTHS["quick" if quick else "device"]


def model_overrides(layers: int, width: dict, variant: str = "eager") -> list[str]:
    """A variant's host model at `layers` blocks of one of WIDTHS (its batch apart)."""
    return [o.format(layers=layers, **width) for o in MODELS.get(variant, HOST_MODEL)]


def at_width(width: dict) -> str:
    """What a timed run's name ends with at `width` (one of WIDTHS, or a table's section of it)."""
    return f" @{width['dim']}"


def run_name(variant: str, layers: int, width: dict) -> str:
    return f"{variant} {layers}{at_width(width)}"


def host_runs(world_size: int, quick: bool = False) -> list[tuple[str, list[str]]]:
    """(name, overrides) of the timed runs at every width, the eager ones ROUNDS times over, round after
    round (a name repeats: its figure is the median of its runs), each round through both widths, so a
    host's drift over the call reaches both alike; TP needs two ranks."""
    variants = {k: v for k, v in VARIANTS.items() if "mesh.tp=2" not in v or world_size >= 2}

    def run(v, L, w):
        return (run_name(v, L, w), model_overrides(L, w, v) + list(QUICK_TIMED if quick else TIMED) + [f"train.batch_size={w['batch'] * (2 if v == 'mb2' else 1)}", *variants[v]])

    def of(compiled_runs):
        return [run(v, L, w) for w in widths(quick) for v in variants if compiled(v) == compiled_runs for L in DEPTHS]

    return of(False) * (1 if quick else ROUNDS) + of(True)


def with_host_section(host: dict, gpus: int, section: dict) -> dict:
    """A table's host section with `section`, timed on `gpus` ranks, in the place of that count's,
    beside the sections of other counts (plan/host.py host_section reads the nearest). A section
    stored before counts were kept is filed under the count its measured_on names ("... x2, torch ...")."""
    by_gpus = dict(host.get("by_gpus", {}))
    if host and not by_gpus:
        measured = re.search(r" x(\d+),", host.get("measured_on", ""))
        if measured is None:
            raise ValueError(f"the table's host section names no rank count in measured_on={host.get('measured_on')!r}: measure it again")
        by_gpus[measured.group(1)] = host
    by_gpus[str(gpus)] = section
    return {"by_gpus": dict(sorted(by_gpus.items(), key=lambda item: int(item[0])))}


def runs_left(runs: list[tuple[str, list[str]]], done: list[dict]) -> list[tuple[str, list[str]]]:
    """The runs of `runs` (host_runs) still to time, given the rows of those timed already (a
    calibration cut off by a time limit resumes): a name timed k times skips its first k runs."""
    timed = Counter(row["config"] for row in done)
    left = []
    for name, overrides in runs:
        if timed[name]:
            timed[name] -= 1
        else:
            left.append((name, overrides))
    return left


def host_times(rows: list[dict]) -> dict[str, float]:
    """The host's seconds per step by run name from the timed runs' rows (runs_in_ranks): a run timed
    in several rounds, the median of its rounds."""
    return _medians(rows, "host_step_s")


def step_times(rows: list[dict]) -> dict[str, float]:
    """The runs' seconds per step (the GPU's, as the trainer times it), by run name, as host_times."""
    return _medians(rows, "step_time_s")


def _medians(rows: list[dict], key: str) -> dict[str, float]:
    rounds: dict[str, list[float]] = {}
    for r in rows:
        rounds.setdefault(r["config"], []).append(r[key])
    return {name: statistics.median(times) for name, times in rounds.items()}


def fit_slowest_host(sections: list[dict]) -> float:
    """How much later than rank 0's host a host-bound step ends, as a ratio: each FSDP collective waits
    for the last rank to issue it, so a step follows the slowest of the ranks' hosts, where the host time
    timed is rank 0's. The median over the narrowest width's eager runs (its block's kernels take a
    fraction of its host time, so the step waits for the host) of their step over their host time; 1
    where the section stored no step times."""
    narrow = min(sections, key=lambda w: w["dim"])
    steps, hosts = narrow.get("measured_step_s", {}), narrow["measured_host_step_s"]
    eager = [name for name in steps if name in hosts and not compiled(name.rsplit(" ", 1)[0])]  # "<variant> <blocks>"
    ratios = [steps[name] / hosts[name] for name in eager]
    return statistics.median(ratios) if ratios else 1.0


@dataclass(frozen=True)
class Counts:
    """What the plan's trace of the host model counts per microbatch (forward and backward)."""

    ops: int  # ops dispatched
    kernels: int  # matmul and attention calls
    ac_ops: int  # ops dispatched with every block checkpointed (its recomputed forward included)
    ac_kernels: int  # ... and matmul and attention calls
    hf_ops: int = 0  # ops dispatched by the host model as an HF Llama (the `hf` run); 0: not traced
    op_ac_ops: int = 0  # ops dispatched with every block under op-level selective AC (the `ac op` run); 0: not traced


def traced_counts(width: dict, hf: bool = False, op_ac: bool = False) -> dict[int, Counts]:
    """The plan's trace of the host model at each depth (the same trace the cost model reads); with
    `hf`, its HF Llama's too (Counts.hf_ops, for the calibrations that timed the `hf` run); with
    `op_ac`, under op-level selective AC (Counts.op_ac_ops, for those that timed the `ac op` run)."""
    return _traced_counts(tuple(sorted(width.items())), hf, op_ac)


@functools.lru_cache(maxsize=None)
def _traced_counts(width_items: tuple, hf: bool, op_ac: bool) -> dict[int, Counts]:
    """traced_counts, once per width in a process: a table's host sections (one per rank count) share
    their widths, and each width's traces take seconds."""
    from fsdp_lab.plan.predict import run_of
    from fsdp_lab.plan.trace import trace_step

    width = dict(width_items)
    out = {}
    for L in DEPTHS:
        run = run_of(model_overrides(L, width))
        t = trace_step(run, layers=L, batch=1, ac="none")
        ac = trace_step(run, layers=L, batch=1, ac="full")
        hf_ops = _ops(trace_step(run_of(model_overrides(L, width, "hf")), layers=L, batch=1, ac="none")) if hf else 0
        op_ac_ops = _ops(trace_step(run_of(model_overrides(L, width) + list(VARIANTS["ac op"])), layers=L, batch=1, ac="selective")) if op_ac else 0
        out[L] = Counts(_ops(t), _kernels(t), _ops(ac), _kernels(ac), hf_ops, op_ac_ops)
    return out


def _ops(trace) -> int:
    return trace.host_ops["fwd"] + trace.host_ops["bwd"]


def _kernels(trace) -> int:
    return sum(1 for op in trace.ops if op.kind != "mem" and op.phase in ("fwd", "bwd"))


def fit_host(host_s: dict[str, float], counts: dict[int, Counts]) -> dict:
    """The table's host section from the runs' host seconds per step ({"eager 2": s, ...}) and the counts."""
    lo, hi = DEPTHS
    blocks = hi - lo
    ops_block = (counts[hi].ops - counts[lo].ops) / blocks
    kernels_block = (counts[hi].kernels - counts[lo].kernels) / blocks
    ac_ops_block = (counts[hi].ac_ops - counts[lo].ac_ops) / blocks  # the recomputed forward's included
    ac_kernels_block = (counts[hi].ac_kernels - counts[lo].ac_kernels) / blocks
    rest_ops = counts[lo].ops - lo * ops_block
    rest_kernels = counts[lo].kernels - lo * kernels_block

    def per_block(v):
        return (host_s[f"{v} {hi}"] - host_s[f"{v} {lo}"]) / blocks

    # The model's ops outside its blocks (embedding, output, loss) at the lab block's mean cost per op.
    # A block's host time: block_s + its ops x block_op_s. Two op mixes of one block's kernels (the
    # lab's and HF's) tell the two apart, kept within what can be (each at least 0); with the lab's
    # alone, all per op.
    op_s = per_block("eager") / ops_block
    block_op_s, block_s = op_s, 0.0
    if "hf 2" in host_s and counts[hi].hf_ops:
        hf_ops_block = (counts[hi].hf_ops - counts[lo].hf_ops) / blocks
        block_op_s = min(max((per_block("hf") - per_block("eager")) / (hf_ops_block - ops_block), 0.0), op_s)
        block_s = per_block("eager") - ops_block * block_op_s
    out = {"op_s": op_s, "block_op_s": block_op_s, "block_s": block_s,
           "step_s": max(host_s[f"eager {lo}"] - counts[lo].ops * op_s, 0.0)}
    if "tp 2" in host_s:
        out["tp_kernel_s"] = max((per_block("tp") - per_block("eager")) / kernels_block, 0.0)
        tp_fixed = host_s[f"tp {lo}"] - lo * per_block("tp") - rest_ops * op_s - rest_kernels * out["tp_kernel_s"]
        out["tp_step_s"] = max(tp_fixed - out["step_s"], 0.0)
    if "tp compiled 2" in host_s:  # a compiled block under TP beyond a compiled block: DTensor at its edges
        out["tp_compiled_block_s"] = max(per_block("tp compiled") - per_block("compiled"), 0.0)
    if "mb2 2" in host_s:  # the second microbatch beyond its own ops: accumulation, FSDP's extra unshard and sync
        out["microbatch_block_s"] = max(per_block("mb2") - 2 * per_block("eager"), 0.0)
        out["microbatch_rest_s"] = max(host_s[f"mb2 {lo}"] - lo * per_block("mb2") - 2 * rest_ops * op_s - out["step_s"], 0.0)
    if "ac 2" in host_s:  # a checkpointed block beyond its ops, the recomputed forward's among them
        out["ac_block_s"] = max(per_block("ac") - block_s - ac_ops_block * block_op_s, 0.0)
    if "ac op 2" in host_s and counts[hi].op_ac_ops:  # the op-level policy's own work in a block beyond its ops
        op_ac_ops_block = (counts[hi].op_ac_ops - counts[lo].op_ac_ops) / blocks
        out["op_ac_block_s"] = max(per_block("ac op") - block_s - op_ac_ops_block * block_op_s, 0.0)
    if "tp ac 2" in host_s:  # a checkpointed block under TP beyond a checkpointed block and TP's kernels in it
        out["tp_ac_block_s"] = max(per_block("tp ac") - per_block("ac") - ac_kernels_block * out["tp_kernel_s"], 0.0)
    # A unit of two blocks issues half the collectives of two units of one (CALIBRATED_COLLECTIVES_PER_BLOCK
    # a block at one to a unit, resharding): what that saves the host, per collective not issued.
    saved = CALIBRATED_COLLECTIVES_PER_BLOCK / 2
    if "group2 2" in host_s:
        out["fsdp_collective_s"] = max((per_block("eager") - per_block("group2")) / saved, 0.0)
    if "group2 compiled 2" in host_s:
        out["fsdp_compiled_collective_s"] = max((per_block("compiled") - per_block("group2 compiled")) / saved, 0.0)
    out["compiled_kernel_s"] = per_block("compiled") / kernels_block
    if "ac compiled 2" in host_s:  # a compiled checkpointed block beyond its kernels (the recomputed ones included)
        out["ac_compiled_block_s"] = max(per_block("ac compiled") - ac_kernels_block * out["compiled_kernel_s"], 0.0)
    compiled_fixed = host_s[f"compiled {lo}"] - lo * per_block("compiled") - rest_ops * op_s
    out["compiled_step_s"] = max(compiled_fixed - out["step_s"], 0.0)
    out["measured_host_step_s"] = host_s
    out["traced"] = {"ops_per_block": ops_block, "kernels_per_block": kernels_block, "rest_ops": rest_ops, "rest_kernels": rest_kernels,
                     "ac_ops_per_block": ac_ops_block, "ac_kernels_per_block": ac_kernels_block,
                     "hf_ops_per_block": (counts[hi].hf_ops - counts[lo].hf_ops) / blocks}
    return out




def width_kernel_s(width: dict, device) -> float:
    """kernel_s of the host model's block at `width` and its batch, priced on `device`."""
    from fsdp_lab.plan.predict import Predictor, run_of

    model = Predictor(run_of(model_overrides(2, width)), device, gpus_per_node=1).model("none")
    block, _ = model.parts(width["batch"], 1, device)
    return kernel_s(block["fwd"])


def fit_widths(host_s: dict[str, float], device, quick: bool = False, step_s: dict[str, float] | None = None) -> list[dict]:
    """A section per width (fit_host of its runs, from `host_s` by run name), with the width and its
    block's kernel_s on `device` (the table's kernel sections), as host_figures reads them, the torch
    whose trace counted the ops, and the runs' step times (`step_s`, by run name) where given."""
    from fsdp_lab.plan.trace import traced_on

    out = []
    for w in widths(quick):
        timed = _of_width(host_s, w)
        counts = traced_counts(w, hf=f"hf {DEPTHS[0]}" in timed, op_ac=f"ac op {DEPTHS[0]}" in timed)
        steps = {"measured_step_s": _of_width(step_s, w)} if step_s else {}
        out.append({**fit_host(timed, counts), **steps, "dim": w["dim"], "block_kernel_s": width_kernel_s(w, device), "traced_on": traced_on()})
    return out


def _of_width(times: dict[str, float], width: dict) -> dict[str, float]:
    """The times of `width`'s runs, by their names without the width (run_name's "<variant> <blocks>")."""
    suffix = at_width(width)
    return {name.removesuffix(suffix): t for name, t in times.items() if name.endswith(suffix)}


def fit_section(host_s: dict[str, float], device, quick: bool = False, step_s: dict[str, float] | None = None) -> dict:
    """A rank count's host section: its widths (fit_widths) and, beside them, slowest_host."""
    sections = fit_widths(host_s, device, quick, step_s)
    return {"widths": sections, "slowest_host": fit_slowest_host(sections)}
