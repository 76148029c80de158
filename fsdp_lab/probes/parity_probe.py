"""The parity probe (probes.parity): a DDP reference, deep-copied before sharding, trains on the same
per-rank batches with the same optimizer, schedule and clipping. Every step compares the losses and
the pre-clip gradient norms (and the extra steps' losses, train.standalone_layer); every
`param_every` steps the parameters. When the verdict first fails (or at the last step with
probes.parity.localize=true) the step is replayed to name the module where the run diverged
(fsdp_lab/probes/localize.py)."""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass

import torch
from torch import nn

from fsdp_lab.accum import Accumulation
from fsdp_lab.config import AccumConfig, ConfigError, RunConfig
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.models import count_params
from fsdp_lab.optim import Optimization, Optimized
from fsdp_lab.parallel.ddp import apply_ddp
from fsdp_lab.probes import localize, rng
from fsdp_lab.probes.base import Probe, ProbeSetup, StepResult
from fsdp_lab.probes.parity import TOLERANCES, ParityVerdict, max_param_abs_diff
from fsdp_lab.step import forward_backward, global_mean, train_step, unmeasured

log = logging.getLogger("fsdp_lab")


def compute_dtype(run: RunConfig) -> torch.dtype:
    if run.mesh.engine != "ddp" and run.fsdp.param_dtype:
        return getattr(torch, run.fsdp.param_dtype)
    return getattr(torch, run.fsdp.cast_after_sharding or "float32")


def tolerance(run: RunConfig) -> float:
    """The loss tolerance: by compute dtype, or with float8 linears the drift float8.parity_tolerance
    accepts from the high-precision reference (which is never converted)."""
    return run.float8.parity_tolerance if run.float8.recipe != "none" else TOLERANCES[compute_dtype(run)]


@dataclass
class Reference(Optimized):
    """The parity reference: a DDP copy of the model with its own optimizer and schedule."""

    model: nn.Module
    optim: Optimization
    accumulation: Accumulation
    verdict: ParityVerdict


@torch.no_grad()
def _copy_into(params: list[torch.Tensor], values: list[torch.Tensor]) -> None:
    for p, v in zip(params, values):
        p.copy_(v)


def _clone(params: list[torch.Tensor]) -> list[torch.Tensor]:
    return [p.detach().clone() for p in params]


class ParityProbe(Probe):
    activity = "parity reference step (DDP all-reduce)"
    metric_keys = (
        "parity/loss_abs_diff", "parity/grad_norm_abs_diff", "parity/param_max_abs_diff", "parity/<extra>_loss_abs_diff",
    )
    summary_keys = ("parity",)

    @staticmethod
    def enabled(run: RunConfig, dims: ParallelDims, ctx) -> bool:
        return run.probes.parity.enabled

    def before_sharding(self, model: nn.Module) -> None:
        self.original = copy.deepcopy(model)

    def attach(self, setup: ProbeSetup) -> None:
        run, device = setup.run, setup.ctx.device
        self.cfg, self.steps, self.dp_group, self.run_dir = run.probes.parity, run.train.steps, setup.dp_group, setup.run_dir
        self.model, self.optim, self.extras = setup.model, setup.optim, setup.extras
        if run.fsdp.cast_after_sharding:  # before DDP wraps it: DDP's buckets take the parameters' dtype
            self.original.to(getattr(torch, run.fsdp.cast_after_sharding))
        ref = apply_ddp(self.original, setup.dp_mesh, device, run.model)
        del self.original
        # DDP accumulates the same microbatches, skipping its all-reduce where the policy defers it.
        ref_sync = "every" if run.train.accum.sync == "every" else "last"
        self.reference = Reference(
            model=ref, optim=Optimization.build(ref, run.optim, run.train.steps, device),
            accumulation=Accumulation(ref, AccumConfig(sync=ref_sync)),
            verdict=ParityVerdict(tolerance=tolerance(run), reference=f"ddp-{run.fsdp.cast_after_sharding or 'fp32'}"),
        )
        self.snapshot: list[torch.Tensor] | None = None
        self.report: dict | None = None

    def around_step(self, step: int, batches):
        self.step_rng = rng.capture(self.ctx.device)  # the reference's forward draws the same dropout masks
        if self.cfg.localize and self.report is None:
            self.snapshot = _clone(list(self.model.parameters()))
        return super().around_step(step, batches)

    def after_step(self, result: StepResult) -> dict:
        ref, verdict = self.reference, self.reference.verdict
        ref_snapshot = _clone(list(ref.model.parameters())) if self.snapshot is not None else None
        with rng.drawing_from(self.step_rng):
            ref_local, ref_norm = train_step(ref.model, ref.optimizer, result.batches, unmeasured, ref.accumulation.microbatch, ref.optim.clip)
        out = {
            "parity/loss_abs_diff": abs(result.loss - global_mean(ref_local, self.dp_group)),
            "parity/grad_norm_abs_diff": abs(result.row["grad/norm"] - float(ref_norm)),
        }
        verdict.update_loss(out["parity/loss_abs_diff"])
        verdict.update_grad_norm(out["parity/grad_norm_abs_diff"])
        for extra in self.extras:
            key = f"parity/{extra.key.replace('/', '_')}_abs_diff"
            out[key] = abs(result.row[extra.key] - global_mean(extra.step(ref.model, ref.optimizer, result.batches), self.dp_group))
            verdict.update_loss(out[key])
        if result.step % self.cfg.param_every == 0 or result.step == self.steps:
            out["parity/param_max_abs_diff"] = max_param_abs_diff(self.model, ref.model)
            verdict.update_params(out["parity/param_max_abs_diff"])
        ref.optim.scheduler.step()
        if self.report is None and (not verdict.ok or (self.cfg.localize and result.step == self.steps)):
            self._localize(result, ref_snapshot)
        if self.cfg.strict and not verdict.ok:
            raise RuntimeError(
                f"parity drift at step {result.step}: loss diff {verdict.max_loss_abs_diff:.3g}, param diff "
                f"{verdict.max_param_abs_diff:.3g}, grad norm diff {verdict.max_grad_norm_abs_diff:.3g} beyond tolerances "
                f"{verdict.tolerance:g} / {verdict.param_tolerance:g} / {verdict.param_tolerance:g} (probes.parity.strict=true); "
                + localize.headline(self.report)
            )
        return out

    def _localize(self, result: StepResult, ref_snapshot: list[torch.Tensor] | None) -> None:
        """Replay the step on both models from before it, if there is a snapshot; without one, name
        the first parameter that already differs (a replay on parameters that differ everywhere
        would blame the first module it runs), or replay on them if none does."""
        ref = self.reference
        drift = None if ref_snapshot is not None else localize.merged_over_ranks(localize.param_drift(self.model, ref.model))
        if drift is not None and localize.first_drifted(drift, ref.model, ref.verdict.param_tolerance) is not None:
            self.report = localize.drift_report(result.step, ref.verdict.param_tolerance, drift, ref.model)
        else:
            self.report = self._replay(result, ref_snapshot)
        self.snapshot = None
        if self.ctx.is_main:
            print(localize.headline(self.report), flush=True)
            if self.run_dir is not None:
                localize.write_report(self.run_dir, self.report)

    def _replay(self, result: StepResult, ref_snapshot: list[torch.Tensor] | None) -> dict:
        ref = self.reference
        params = list(self.model.parameters()) + list(ref.model.parameters())
        after = None
        if ref_snapshot is not None:
            after = _clone(params)
            _copy_into(params, self.snapshot + ref_snapshot)
        for optimizer in (self.optim.optimizer, ref.optimizer):
            optimizer.zero_grad(set_to_none=True)

        def replay_reference():
            with rng.drawing_from(self.step_rng):
                forward_backward(ref.model, result.batches, unmeasured, ref.accumulation.microbatch)

        def replay():
            with rng.drawing_from(self.step_rng):
                result.replay()

        order, found = localize.compare(self.model, ref.model, replay, replay_reference)
        for optimizer in (self.optim.optimizer, ref.optimizer):
            optimizer.zero_grad(set_to_none=True)
        if after is not None:
            _copy_into(params, after)
        replayed_on = "the parameters before the step" if after is not None else "the parameters the step left"
        return localize.build_report(result.step, replayed_on, ref.verdict.tolerance, order, localize.merged_over_ranks(found))

    def summary(self) -> dict:
        section = self.reference.verdict.as_summary()
        if self.report is not None:
            section["localized"] = {
                "step": self.report["step"],
                "forward_module": (self.report["forward"] or {}).get("module"),
                "grad_module": (self.report["grad"] or {}).get("module"),
                "param": (self.report.get("param") or {}).get("name"),
                "report": localize.REPORT_JSON,
            }
            if not section["ok"]:
                section["first_divergence"] = localize.headline(self.report)
        return {"parity": section}


# What the parity reference holds per parameter: fp32 weight, gradient and two optimizer states.
REFERENCE_BYTES_PER_PARAM = 16


def reference_bytes(n_params: int) -> int:
    """What the parity reference holds on every rank: the whole model, its gradients and optimizer state."""
    return n_params * REFERENCE_BYTES_PER_PARAM


def check_reference_fits(run: RunConfig, dims: ParallelDims, device_type: str, model: nn.Module) -> None:
    """The parity reference is the whole model on every rank, by nature: refuse what cannot fit.
    Its parameters are counted only where the reference runs (mode=plan checks thousands of layouts)."""
    if not run.probes.parity.enabled or run.mode != "train":
        return
    n_params = count_params(model)
    need = reference_bytes(n_params)
    if device_type == "cuda":
        if not torch.cuda.is_available():  # a job checked on a login node (launch_plan.py): its GPUs are unknown here
            return
        have, where = torch.cuda.get_device_properties(0).total_memory, "one GPU's memory"
    else:
        need *= dims.world_size  # every rank's reference shares this host
        have, where = host_available(), f"this host's available memory, for {dims.world_size} ranks"
    if have is not None and need > have:
        raise ConfigError(
            f"probes.parity.enabled=true: the parity reference holds the whole model ({n_params / 1e9:.2f}B parameters) "
            f"on every rank, {need / 2**30:.0f} GiB with its gradients and optimizer state, more than {where} "
            f"({have / 2**30:.0f} GiB); allowed: probes.parity.enabled=false"
        )


def host_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None
