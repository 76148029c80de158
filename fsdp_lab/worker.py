"""What every rank runs: dist init -> mesh -> model -> parallelize -> probes -> train -> sinks.

Rank 0 writes the run dir's metrics.jsonl, summary.json and the W&B run; every rank reports its
own failure so the launcher can name it."""

from __future__ import annotations

import copy
import logging
import os
import signal
import sys
import time
import traceback
from dataclasses import asdict
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

from fsdp_lab.accum import Accumulation
from fsdp_lab.checks import describe, evaluate
from fsdp_lab.checkpoint import Checkpointer, agreed_resume, read_meta
from fsdp_lab.config import AccumConfig, RunConfig
from fsdp_lab.failure_report import record_failure
from fsdp_lab.dist import DistContext, init_distributed, resolve_device_type, set_determinism
from fsdp_lab.freeze import freeze
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.models import build_model, count_params
from fsdp_lab.optim import build_optimizer
from fsdp_lab.parallel import parallelize
from fsdp_lab.parallel.ddp import apply_ddp
from fsdp_lab.parallel.fsdp2 import cast_after_sharding, record_post_optim_event
from fsdp_lab.parallel.pipeline import build_pipeline
from fsdp_lab.probes.comm import CommCounter
from fsdp_lab.probes.memory import PhaseMemory
from fsdp_lab.probes.memory_breakdown import ModuleBreakdown, table_rows, write_breakdown
from fsdp_lab.probes.parity import TOLERANCES, ParityVerdict, change_since
from fsdp_lab.probes.perf import Throughput
from fsdp_lab.sinks.files import MetricsFile, keep_metrics_through, read_metrics, write_summary
from fsdp_lab.sinks.wandb_sink import WandbSink, mesh_job_type
from fsdp_lab.standalone import StandaloneLayer
from fsdp_lab.train import Reference, Trainer, loss_fn

log = logging.getLogger("fsdp_lab")


class CollectiveTimeout(RuntimeError):
    """A collective did not complete within launch.timeout_s; names what the rank was doing."""


def _is_collective_timeout(e: BaseException) -> bool:
    # gloo raises RuntimeError("... Timed out waiting ..."), NCCL's watchdog DistBackendError("... timeout ...").
    text = str(e).lower()
    return isinstance(e, RuntimeError) and ("timed out" in text or "timeout" in text)


def _is_peer_gone(e: BaseException) -> bool:
    """gloo's error in a rank whose peer failed first and closed its connections."""
    text = str(e).lower()
    return "closed by peer" in text or "reset by peer" in text


# The launcher names the first rank to exit; the peer that failed first exits within this time.
PEER_FAILURE_GRACE_S = 2.0


class Terminated(Exception):
    """The launcher stopped this rank (SIGTERM), usually because another rank failed."""


def _raise_terminated(signum, frame):
    raise Terminated(f"rank stopped by signal {signal.Signals(signum).name} (another rank failed or the run was stopped)")


def _compute_dtype(run: RunConfig) -> torch.dtype:
    if run.mesh.engine != "ddp" and run.fsdp.param_dtype:
        return getattr(torch, run.fsdp.param_dtype)
    return getattr(torch, run.fsdp.cast_after_sharding or "float32")


def base_summary(run: RunConfig, dims: ParallelDims, device: str) -> dict:
    return {
        "status": "running", "error": None, "steps": 0, "world_size": dims.world_size, "device": device,
        "mesh": {**dims.as_dict(), "engine": run.mesh.engine},
    }


@record_failure
def rank_main(run: RunConfig, run_dir: str, dims: ParallelDims) -> None:
    """Entry point of a spawned or externally launched rank."""
    logging.basicConfig(level=logging.INFO if os.environ.get("RANK") == "0" else logging.WARNING, format="%(message)s")
    signal.signal(signal.SIGTERM, _raise_terminated)
    ctx = init_distributed(resolve_device_type(run.device), run.launch.timeout_s)
    summary = base_summary(run, dims, ctx.device.type)
    run_path = Path(run_dir)
    sinks: _RankZeroSinks | None = None
    trainer: Trainer | None = None
    try:
        resume_from = agreed_resume(run.checkpoint.resume, run_path, ctx.rank)
        start_step = read_meta(resume_from)["step"] if resume_from else 0
        if ctx.is_main:
            sinks = _RankZeroSinks(run, run_path, dims, ctx, start_step)
        trainer = build_trainer(run, dims, ctx, on_step=sinks.on_step if sinks else lambda row: None)
        checkpointer = _attach_checkpointer(run, run_path, trainer, ctx, resume_from)
        trainer.run(start_step)
        summary.update(status="ok", steps=run.train.steps, final_loss=trainer.last_loss)
        summary.update(_probe_summaries(run, trainer))
        summary["checkpoint"] = checkpointer.summary() if checkpointer else None
        if sinks is not None and trainer.breakdown is not None:
            sinks.on_breakdown(trainer.breakdown.report)
        if ctx.is_main:
            print(f"done: {run.train.steps} steps, final loss {trainer.last_loss:.6f}", flush=True)
    except BaseException as e:
        interrupted = isinstance(e, (KeyboardInterrupt, Terminated))
        summary.update(status="interrupted" if interrupted else "failed", error=f"rank {ctx.rank}: {type(e).__name__}: {e}")
        if sinks is not None:
            summary["steps"] = sinks.steps_done
        traceback.print_exc(file=sys.stderr)
        if _is_peer_gone(e):
            time.sleep(PEER_FAILURE_GRACE_S)  # so the error reported is the peer's, not this echo of it
        if _is_collective_timeout(e):
            where = trainer.activity if trainer is not None else "setup"
            raise CollectiveTimeout(
                f"a collective timed out after launch.timeout_s={run.launch.timeout_s}s during {where} "
                f"(a peer rank stopped or hangs): {str(e).splitlines()[0]}"
            ) from e
        raise
    finally:
        if sinks is not None:
            sinks.close(summary)
        if dist.is_initialized():
            dist.destroy_process_group()


def build_trainer(run: RunConfig, dims: ParallelDims, ctx: DistContext, on_step) -> Trainer:
    set_determinism(run.train.seed, run.train.deterministic)
    mesh, dp_mesh = dims.build_meshes(ctx.device.type)
    model = build_model(run.model, run.train.seed)
    frozen_initial = freeze(model, run.model.freeze)  # before the copy: the reference is frozen alike
    reference_model = copy.deepcopy(model) if run.probes.parity.enabled else None
    n_params = count_params(model)
    # Before parallelizing: FSDP1 swaps the parameters for flat shards, which would undercount.
    flops_per_token = model.flops_per_token(run.train.seq_len)
    tokens_per_sample = model.tokens_per_sample(run.train.seq_len)
    parallelize_one = partial(parallelize, dims=dims, mesh=mesh, dp_mesh=dp_mesh, run=run, device=ctx.device)
    if dims.pp_enabled:
        model = build_pipeline(
            model, model_cfg=run.model, mesh_cfg=run.mesh, pp_mesh=mesh["pp"], n_microbatches=run.train.microbatches,
            seq_len=run.train.seq_len, device=ctx.device, loss_fn=loss_fn, parallelize_stage=parallelize_one,
        )
    else:
        model = parallelize_one(model)
    if run.fsdp.cast_after_sharding:
        dtype = getattr(torch, run.fsdp.cast_after_sharding)
        cast_after_sharding(model, dtype)
        if reference_model is not None:  # before DDP wraps it: DDP's buckets take the parameters' dtype
            reference_model.to(dtype)
    optimizer = build_optimizer(model.parameters(), run.optim, ctx.device)
    if run.fsdp.post_optim_event:
        record_post_optim_event(model, optimizer, ctx.device)
    if ctx.is_main:
        log.info("model %s: %.2fM params, mesh %s, engine %s", run.model.name, n_params / 1e6, dims.as_dict(), run.mesh.engine)
    reference = None
    if reference_model is not None:
        ref = apply_ddp(reference_model, dp_mesh, ctx.device)
        # DDP accumulates the same microbatches, skipping its all-reduce where the policy defers it.
        ref_sync = "every" if run.train.accum.sync == "every" else "last"
        reference = Reference(
            model=ref, optimizer=build_optimizer(ref.parameters(), run.optim, ctx.device),
            accumulation=Accumulation(ref, AccumConfig(sync=ref_sync)),
            verdict=ParityVerdict(tolerance=TOLERANCES[_compute_dtype(run)], reference=f"ddp-{run.fsdp.cast_after_sharding or 'fp32'}"),
            param_every=run.probes.parity.param_every, strict=run.probes.parity.strict,
        )
    throughput = None
    if run.probes.perf.enabled:
        throughput = Throughput(
            tokens_per_step=dims.dp * run.train.batch_size * tokens_per_sample,
            world_size=dims.world_size, flops_per_token=flops_per_token,
            device=ctx.device, warmup_steps=run.probes.perf.warmup_steps,
        )
    memory = _memory_probe(run, dims, ctx, model, optimizer)
    breakdown = None
    if run.probes.memory.tracker == "module":
        breakdown = ModuleBreakdown(model, optimizer, ctx.device, step=run.probes.memory.tracker_step, gather=True)
    return Trainer(
        model=model, optimizer=optimizer, train=run.train, fault=run.fault, rank=ctx.rank,
        dp_rank=dp_mesh.get_local_rank(), dp_group=dp_mesh.get_group(), device=ctx.device,
        memory=memory, throughput=throughput, reference=reference, on_step=on_step,
        accumulation=Accumulation(model, run.train.accum) if run.train.microbatches > 1 else None,
        comm=CommCounter() if run.probes.comm.enabled else None, breakdown=breakdown,
        frozen_initial=frozen_initial or None,
        standalone=None if run.train.standalone_layer is None else StandaloneLayer(run.train.standalone_layer, dp_mesh.get_group()),
    )


def _memory_probe(run: RunConfig, dims: ParallelDims, ctx: DistContext, model, optimizer) -> PhaseMemory | None:
    if not run.probes.memory.enabled:
        return None
    if dims.pp_enabled and ctx.device.type == "cpu":
        # MemTracker's multi-grad hooks fail on the leaf inputs that a stage's autograd.grad differentiates.
        if ctx.is_main:
            log.warning("probes.memory.enabled=true is ignored: on CPU the memory probe cannot follow a pipeline (mesh.pp=%d)", dims.pp)
        return None
    return PhaseMemory(ctx.device, model, optimizer)


def _attach_checkpointer(run: RunConfig, run_dir: Path, trainer: Trainer, ctx: DistContext, resume_from: Path | None):
    """Restore the trainer from `resume_from`, and let it save checkpoints when checkpoint=dcp."""
    if run.checkpoint.kind == "none" and resume_from is None:
        return None
    checkpointer = Checkpointer(run, run_dir, trainer, ctx.rank, fault_point=trainer.inject_fault)
    if resume_from is not None:
        checkpointer.load(resume_from)
    if run.checkpoint.kind == "dcp":
        trainer.checkpointer = checkpointer
    return checkpointer


def _probe_summaries(run: RunConfig, trainer: Trainer) -> dict:
    out: dict = {"parity": {"enabled": False}, "memory": None, "perf": None}
    if trainer.reference is not None:
        out["parity"] = trainer.reference.verdict.as_summary()
    if trainer.memory is not None:
        out["memory"] = trainer.memory.summary()
    if trainer.breakdown is not None:
        report = trainer.breakdown.report
        out["memory"] = {
            **(out["memory"] or {}), "tracker_peak_mib": report["peak_mib"],
            "tracker_peak_categories_mib": report["peak_categories_mib"], "tracker_accuracy": report["tracker_accuracy"],
        }
    if trainer.frozen_initial is not None:
        change, numel = change_since(trainer.model, trainer.frozen_initial)
        out["frozen"] = {"params": len(trainer.frozen_initial), "compared_numel": numel, "max_abs_change": change}
    if trainer.throughput is not None:
        out["perf"] = trainer.throughput.summary()
    return out


class _RankZeroSinks:
    """metrics.jsonl, W&B and the progress line: rank 0 only."""

    def __init__(self, run: RunConfig, run_dir: Path, dims: ParallelDims, ctx: DistContext, start_step: int):
        self.run, self.steps_done = run, start_step
        if start_step:  # resumed: continue the file, without the rows this run computes again
            keep_metrics_through(run_dir, start_step)
        self.metrics = MetricsFile(run_dir, append=start_step > 0)
        self.wandb = None
        if run.logger.kind == "wandb":
            self.wandb = WandbSink(
                run.logger, run_dir=run_dir, name=run.name, config=asdict(run),
                job_type=mesh_job_type(run.mesh.engine, dims.as_dict()),
            )

    def on_step(self, row: dict) -> None:
        self.steps_done = row["step"]
        self.metrics.write(row)
        if self.wandb is not None:
            self.wandb.log(row)
        print(_progress_line(row, self.run.train.steps), flush=True)

    def on_breakdown(self, report: dict) -> None:
        write_breakdown(Path(self.metrics.path.parent), report)
        if self.wandb is not None:
            self.wandb.log_table("tables/memory_breakdown", *table_rows(report))

    def close(self, summary: dict) -> None:
        self.metrics.close()
        if summary["status"] == "ok" and self.run.checks:
            summary["checks"] = evaluate(self.run.checks, summary, read_metrics(self.metrics.path.parent))
            for spec, v in summary["checks"].items():
                print(describe(spec, v), flush=True)
        write_summary(Path(self.metrics.path.parent), summary)
        if self.wandb is not None:
            self.wandb.finish(summary, exit_code=0 if summary["status"] == "ok" else 1)


def _progress_line(row: dict, steps: int) -> str:
    parts = [f"step {row['step']}/{steps}", f"loss {row['loss']:.5f}"]
    if "parity/loss_abs_diff" in row:
        parts.append(f"parity Δloss {row['parity/loss_abs_diff']:.1e}")
    if "memory/peak_mib" in row:
        parts.append(f"peak {row['memory/peak_mib']:.2f} MiB")
    if "perf/step_time_s" in row:
        parts.append(f"{row['perf/step_time_s'] * 1e3:.1f} ms")
    return " | ".join(parts)
