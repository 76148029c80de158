"""The candidates of a plan: every mesh of plan.gpus GPUs (pp x dp_replicate x dp_shard x tp, tp within
a node), AC none/full, the microbatch counts that divide a rank's batch, resharding on/off; each one
the lab itself accepts (the checks a run gets before its ranks start), priced, and ranked by
predicted tokens/s per GPU among those that fit in memory."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fsdp_lab.config import ConfigError, RunConfig
from fsdp_lab.estimate.refusals import check_estimable
from fsdp_lab.mesh import ParallelDims, degrees
from fsdp_lab.plan.cost import Layout
from fsdp_lab.plan.predict import Predictor
from fsdp_lab.validate import check_run

AC_MODES = ("none", "full")


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
    )


def overrides(layout: Layout) -> list[str]:
    return [*(f"mesh.{name}={degree}" for name, degree in degrees(layout).items()), f"ac={layout.ac}", f"train.batch_size={layout.microbatch_size * layout.microbatches}",
            f"train.microbatches={layout.microbatches}", f"fsdp.reshard_after_forward={str(layout.reshard).lower()}"]


def layouts(run: RunConfig, samples: int) -> list[Layout]:
    """Every layout of plan.gpus GPUs the lab accepts, each rank getting samples / dp samples per step."""
    p = run.plan
    out = []
    for pp, rep, shard, tp in meshes(p.gpus, p.gpus_per_node):
        dp = rep * shard
        if samples % dp:
            continue
        batch = samples // dp
        for mbs in divisors(batch):
            if mbs > p.max_microbatches or (pp > 1 and mbs < pp):
                continue
            for ac in AC_MODES:
                for reshard in ((True, False) if shard > 1 and pp == 1 else (True,)):
                    layout = Layout(pp, rep, shard, tp, ac, mbs, batch // mbs, reshard, run.model.compile)
                    if _accepted(run, layout):
                        out.append(layout)
    return out


def _accepted(run: RunConfig, layout: Layout) -> bool:
    dims = ParallelDims.from_mesh(layout, layout.world)
    try:
        check_run(run_for(run, layout), dims, "cuda")
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
    """Every accepted layout priced; those that fit first, fastest first. The peaks are closed-form;
    the best plan.estimate_top that the estimate takes get its figure at their own config."""
    budget = predictor.device.memory_bytes * run.plan.memory_fraction
    tokens = samples * run.train.seq_len
    out = []
    for layout in layouts(run, samples):
        pred = {**predictor.predict(layout), "memory_from": "closed form"}
        per_gpu = tokens / run.plan.gpus / pred["step_time_s"]
        out.append(Candidate(layout, pred, pred["peak_mib"] * 2**20 <= budget, per_gpu, per_gpu * flops_per_token / predictor.device.peak_flops))
    order = lambda c: (not c.fits, -c.tokens_per_s)  # noqa: E731
    out.sort(key=order)
    for _ in range(run.plan.estimate_top):
        c = next((c for c in out if c.fits and c.prediction["memory_from"] == "closed form" and _estimable(run, c.layout)), None)
        if c is None:
            break
        c.prediction.update(peak_mib=estimated_peak_mib(run, c.layout), memory_from="estimate", closed_form_peak_mib=c.prediction["peak_mib"])
        c.fits = c.prediction["peak_mib"] * 2**20 <= budget
        out.sort(key=order)
    return out


def _estimate_run(run: RunConfig, layout: Layout) -> RunConfig:
    """The layout's own run as mode=estimate takes it (compiled blocks hold what eager ones do)."""
    traced = run_for(run, layout)
    return dataclasses.replace(traced, mode="estimate", model=dataclasses.replace(traced.model, compile=False))


def _estimable(run: RunConfig, layout: Layout) -> bool:
    """Whether mode=estimate takes the layout's run: its own refusals decide."""
    try:
        check_estimable(_estimate_run(run, layout))
    except ConfigError:
        return False
    return True


def estimated_peak_mib(run: RunConfig, layout: Layout) -> float:
    """mode=estimate's peak for the layout's own run (with pipeline stages, the largest pp rank's): what
    the plan shows for its best candidates, and benchmarks/plan_accuracy.py checks against measured peaks."""
    from fsdp_lab.estimate import estimate
    from fsdp_lab.plan.trace import quiet

    dims = ParallelDims.from_mesh(layout, layout.world)
    with quiet():
        return estimate(_estimate_run(run, layout), dims)["peak_mib"]
