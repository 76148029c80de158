"""The candidates of a plan: every mesh of plan.gpus GPUs (pp x dp_replicate x dp_shard x tp, tp within
a node), AC none/full, the microbatch counts that divide a rank's batch, resharding on/off, compiled
or eager blocks (plan.search_compile), wrap.group 1, 2 or 4 (blocks to one FSDP unit); each one
the lab itself accepts (the checks a run gets before its ranks start), priced, and ranked by
predicted tokens/s per GPU among those that fit in memory (fits.py: the rule and its margin)."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

from fsdp_lab.config import ConfigError, RunConfig
from fsdp_lab.mesh import ParallelDims, degrees
from fsdp_lab.models import build_meta
from fsdp_lab.plan.cost import Layout
from fsdp_lab.plan.fits import estimable, estimated_as, estimated_peak_mib, fits
from fsdp_lab.plan.predict import Predictor
from fsdp_lab.plan.side_by_side import SideBySide
from fsdp_lab.validate import check_run

AC_MODES = ("none", "full")
# wrap.group: the speed work found 2 (compiled) and 4 (eager: FSDP's host work per unit paid a quarter
# as often) blocks per FSDP unit worth their memory; only groups that divide a stage's blocks, which the
# cost model prices as equal units.
GROUPS = (1, 2, 4)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def meshes(gpus: int, gpus_per_node: int) -> list[tuple[int, int, int, int]]:
    """(pp, dp_replicate, dp_shard, tp) with product gpus and tp dividing a node."""
    out = []
    for tp in divisors(min(gpus, gpus_per_node)):
        if gpus % tp:
            continue
        for pp in divisors(gpus // tp):
            dp = gpus // tp // pp
            out += [(pp, rep, dp // rep, tp) for rep in divisors(dp)]
    return out


def run_for(run: RunConfig, layout: Layout) -> RunConfig:
    """The run a layout stands for: what its overrides set."""
    return dataclasses.replace(
        run, mode="train",
        mesh=dataclasses.replace(run.mesh, **degrees(layout), world_size=layout.world),
        train=dataclasses.replace(run.train, batch_size=layout.microbatch_size * layout.microbatches, microbatches=layout.microbatches),
        ac=dataclasses.replace(run.ac, mode=layout.ac), fsdp=dataclasses.replace(run.fsdp, reshard_after_forward=layout.reshard),
        model=dataclasses.replace(run.model, compile=layout.compile), wrap=dataclasses.replace(run.wrap, group=layout.wrap_group),
    )


def overrides(layout: Layout) -> list[str]:
    return [*(f"mesh.{name}={degree}" for name, degree in degrees(layout).items()), f"ac={layout.ac}",
            f"train.batch_size={layout.microbatch_size * layout.microbatches}", f"train.microbatches={layout.microbatches}",
            f"fsdp.reshard_after_forward={str(layout.reshard).lower()}", f"model.compile={str(layout.compile).lower()}",
            f"wrap.group={layout.wrap_group}"]


def layouts(run: RunConfig, samples: int) -> list[Layout]:
    """Every layout of plan.gpus GPUs the lab accepts, each rank getting samples / dp samples per step."""
    p = run.plan
    built = {c: build_meta(dataclasses.replace(run.model, compile=c)) for c in compile_options(run)}  # checked, never changed
    # The parity reference is left out of every layout's check: it is the whole model on every rank
    # whatever the layout (the plan turns it off in its command lines where it cannot fit: plan/run.py
    # parity_note), and check_reference_fits would read the GPU in hand, not the planned one.
    checked = dataclasses.replace(run, probes=dataclasses.replace(run.probes, parity=dataclasses.replace(run.probes.parity, enabled=False)))
    out = []
    blocks = len(next(iter(built.values())).blocks)
    for pp, rep, shard, tp in meshes(p.gpus, p.gpus_per_node):
        dp = rep * shard
        if samples % dp:
            continue
        batch = samples // dp
        groups = [g for g in GROUPS if (blocks // pp) % g == 0] if shard > 1 else [1]
        for mbs in divisors(batch):
            if mbs > p.max_microbatches or (pp > 1 and mbs < pp):
                continue
            for ac, compiled, group in itertools.product(AC_MODES, compile_options(run), groups):
                for reshard in ((True, False) if shard > 1 and pp == 1 else (True,)):
                    layout = Layout(pp, rep, shard, tp, ac, mbs, batch // mbs, reshard, compiled, group)
                    if _accepted(checked, layout, built[compiled]):
                        out.append(layout)
    return out


def compile_options(run: RunConfig) -> tuple[bool, ...]:
    return (False, True) if run.plan.search_compile else (run.model.compile,)


def _accepted(run: RunConfig, layout: Layout, model) -> bool:
    dims = ParallelDims.from_mesh(layout, layout.world)
    try:
        check_run(run_for(run, layout), dims, "cuda", model)
    except ConfigError:
        return False
    return True


@dataclass
class Candidate:
    layout: Layout
    prediction: dict
    fits: bool
    tokens_per_s: float  # per GPU
    mfu: float

    def row(self) -> dict:
        return {"layout": dataclasses.asdict(self.layout), "overrides": overrides(self.layout), "fits": self.fits,
                "tokens_per_s_per_gpu": self.tokens_per_s, "mfu": self.mfu, **self.prediction}


def rank(run: RunConfig, predictor: Predictor, samples: int, flops_per_token: float) -> list[Candidate]:
    """Every accepted layout priced; those that fit first, fastest first. The closed-form peaks prune;
    every candidate among the plan.top shown that would be marked as fitting first gets mode=estimate's
    peak at its own config and the fits rule (fits.py); one the estimate does not take is not shown
    as fitting."""
    memory = predictor.device.memory_bytes
    tokens = samples * run.train.seq_len
    accepted = layouts(run, samples)
    out = []
    with SideBySide(run.plan.workers) as side:
        predictor.take_traces((layout.ac for layout in accepted), side)
        for layout in accepted:
            pred = {**predictor.predict(layout), "memory_from": "closed form"}
            per_gpu = tokens / run.plan.gpus / pred["step_time_s"]
            out.append(Candidate(layout, pred, fits(pred["peak_mib"], run, memory), per_gpu, per_gpu * flops_per_token / predictor.device.peak_flops))
        order = lambda c: (not c.fits, -c.tokens_per_s)  # noqa: E731
        out.sort(key=order)
        while unverified := [c for c in out[: run.plan.top] if c.fits and c.prediction["memory_from"] == "closed form"]:
            _verify(run, unverified, predictor, memory, side)
            out.sort(key=order)
    return out


def _verify(run: RunConfig, candidates: list[Candidate], predictor: Predictor, memory: float, side: SideBySide) -> None:
    """Each candidate's fits by mode=estimate's peak, the traces not yet taken side by side
    (plan.workers); one the estimate does not take cannot be shown as fitting."""
    for c in candidates:
        if not estimable(run, c.layout):
            c.prediction["memory_from"], c.fits = "closed form, not estimable", False
    estimated = [c for c in candidates if c.prediction["memory_from"] == "closed form"]
    peaks = predictor.estimated_peaks
    todo = [layout for layout in dict.fromkeys(estimated_as(c.layout) for c in estimated) if layout not in peaks]
    peaks.update(zip(todo, side.map(estimated_peak_mib, [(run, layout, predictor.facts.layers) for layout in todo])))
    for c in estimated:
        peak = peaks[estimated_as(c.layout)]
        c.prediction.update(peak_mib=peak, memory_from="estimate", closed_form_peak_mib=c.prediction["peak_mib"])
        c.fits = fits(peak, run, memory)
