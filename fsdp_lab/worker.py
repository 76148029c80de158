"""What every rank runs: dist init -> mesh -> model -> parallelize -> probes -> train -> sinks.

Rank 0 writes the run dir's metrics.jsonl, summary.json and the W&B run; every rank reports its
own failure so the launcher can name it."""

from __future__ import annotations

import copy
import gc
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
from fsdp_lab.config import RunConfig
from fsdp_lab.failure_report import record_failure
from fsdp_lab.dist import DistContext, close_distributed, init_distributed, resolve_device_type, set_determinism
from fsdp_lab.fault import Faults
from fsdp_lab.freeze import freeze
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.models import build_meta, count_params, materializer, model_spec
from fsdp_lab.optim import Optimization
from fsdp_lab.parallel import parallelize
from fsdp_lab.parallel.float8 import precompute_scales_after_step
from fsdp_lab.parallel.fsdp2 import cast_after_sharding, record_post_optim_event
from fsdp_lab.parallel.pipeline import build_pipeline
from fsdp_lab.parallel.symm_mem import use_zero_cta_policy
from fsdp_lab.probes.base import Probe, ProbeSetup
from fsdp_lab.probes.registry import build_probes
from fsdp_lab.sinks.files import MetricsFile, keep_metrics_through, read_metrics, write_summary
from fsdp_lab.sinks.wandb_sink import WandbSink, mesh_job_type
from fsdp_lab.standalone import StandaloneLayer
from fsdp_lab.step import compiled_loss_fn, loss_fn
from fsdp_lab.summary import base_summary, finished
from fsdp_lab.train import Trainer

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


@record_failure
def rank_main(run: RunConfig, run_dir: str, dims: ParallelDims) -> None:
    """Entry point of a spawned or externally launched rank."""
    logging.basicConfig(level=logging.INFO if os.environ.get("RANK") == "0" else logging.WARNING, format="%(message)s")
    signal.signal(signal.SIGTERM, _raise_terminated)
    device_type = resolve_device_type(run.device)
    if run.fsdp.symm_mem and device_type == "cuda":
        use_zero_cta_policy()
    ctx = init_distributed(device_type, run.launch.timeout_s)
    summary = base_summary(run, dims, ctx.device.type)
    run_path = Path(run_dir)
    sinks: _RankZeroSinks | None = None
    trainer: Trainer | None = None
    checkpointer: Checkpointer | None = None
    failed = False
    try:
        resume_from = agreed_resume(run.checkpoint.resume, run_path, ctx.rank)
        start_step = read_meta(resume_from)["step"] if resume_from else 0
        if ctx.is_main:
            sinks = _RankZeroSinks(run, run_path, dims, ctx, start_step)
        trainer = build_trainer(run, dims, ctx, on_step=sinks.on_step if sinks else lambda row: None, run_dir=run_path)
        checkpointer = _checkpointer(run, run_path, trainer, ctx, resume_from)
        trainer.run(start_step, checkpointer if run.checkpoint.kind == "dcp" else None)
        summary = finished(
            summary, steps=run.train.steps, final_loss=trainer.last_loss, probes=trainer.probes,
            checkpoint=checkpointer.summary() if checkpointer else None,
        )
        if sinks is not None:
            sinks.publish(trainer.probes)
        if ctx.is_main:
            print(f"done: {run.train.steps} steps, final loss {trainer.last_loss:.6f}{parity_failed(summary)}", flush=True)
    except BaseException as e:
        failed = True
        interrupted = isinstance(e, (KeyboardInterrupt, Terminated))
        summary.update(status="interrupted" if interrupted else "failed", error=f"rank {ctx.rank}: {type(e).__name__}: {e}")
        if sinks is not None:
            summary["steps"] = sinks.steps_done
        traceback.print_exc(file=sys.stderr)
        release_frames(e)
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
        # Nothing of the model may outlive the process group (release_frames says why): freed here, the
        # group's last holder is destroy_process_group's, which waits for gloo's threads without the GIL.
        sinks = trainer = checkpointer = None
        gc.collect()
        if dist.is_initialized():
            close_distributed(failed)


def release_frames(error: BaseException) -> None:
    """Drop the locals of the frames that `error` (and the errors it chains) passed through, which hold
    the trainer and its model. DDP's C++ reducer holds the process group: left as its last holder, it
    destroys the group holding the GIL, and gloo's destructor joins worker threads of which one may still
    be freeing a finished collective's tensor, which takes the GIL: the rank hangs at its exit (once in 114
    1-rank CPU runs beside a loop of 2-rank ones; none in 870 since). The traceback's text is kept."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        traceback.clear_frames(error.__traceback__)
        error = error.__cause__ or error.__context__


def parity_failed(summary: dict) -> str:
    """What the final line adds when the parity verdict failed (without probes.parity.strict the run
    still trains to the end): the verdict and where the run first diverged."""
    parity = summary.get("parity") or {}
    if parity.get("ok", True):
        return ""
    where = parity.get("first_divergence") or (
        f"max loss diff {parity['max_loss_abs_diff']:.3g}, max param diff {parity['max_param_abs_diff']:.3g}"
    )
    return f"; parity FAILED: {where}"


def build_trainer(run: RunConfig, dims: ParallelDims, ctx: DistContext, on_step, run_dir: Path | None = None) -> Trainer:
    """The run's model, parallelized, its optimizer and its probes (fsdp_lab.probes.registry)."""
    set_determinism(run.train.seed, run.train.deterministic)
    mesh, dp_mesh = dims.build_meshes(ctx.device.type)
    probes = build_probes(run, dims, ctx)
    model = build_meta(run.model)  # parameters on meta: materialised once sharded
    init = materializer(model, run.model, run.train.seed)
    freeze(model, run.model.freeze)  # before the probes copy it: the reference is frozen alike
    if any(type(probe).before_sharding is not Probe.before_sharding for probe in probes):
        # What a probe keeps of the model before sharding (the parity reference) is the whole model.
        whole = copy.deepcopy(model)
        materializer(whole, run.model, run.train.seed).materialise(whole, ctx.device)
        for probe in probes:
            probe.before_sharding(whole)
        del whole
    n_params = count_params(model)
    # Before parallelizing: FSDP1 swaps the parameters for flat shards, which would undercount.
    flops_per_token = model.flops_per_token(run.train.seq_len)
    tokens_per_sample = model.tokens_per_sample(run.train.seq_len)
    # FSDP1 flattens and DDP broadcasts real parameters: they get the whole model, FSDP2 only its shards.
    shard_first = run.mesh.engine == "fsdp2"
    if not shard_first:
        init.materialise(model, ctx.device)
    parallelize_one = partial(parallelize, dims=dims, mesh=mesh, dp_mesh=dp_mesh, run=run, device=ctx.device)
    loss = compiled_loss_fn() if run.model.compile else loss_fn
    if dims.pp_enabled:
        model = build_pipeline(
            model, stage_cls=model_spec(run.model.name).pipeline_stage, mesh_cfg=run.mesh, pp_mesh=mesh["pp"], n_microbatches=run.train.microbatches,
            seq_len=run.train.seq_len, device=ctx.device, loss_fn=loss, parallelize_stage=parallelize_one,
        )
    else:
        model = parallelize_one(model)
    if shard_first:
        offload = torch.device("cpu") if run.fsdp.cpu_offload else None  # CPUOffloadPolicy keeps shards on the host
        init.materialise(model, ctx.device, param_device=offload)
    if run.fsdp.cast_after_sharding:
        cast_after_sharding(model, getattr(torch, run.fsdp.cast_after_sharding))
    pp_group = mesh["pp"].get_group() if dims.pp_enabled else None
    optim = Optimization.build(model, run.optim, run.train.steps, ctx.device, pp_group=pp_group)
    if run.fsdp.post_optim_event:
        record_post_optim_event(model, optim.optimizer, ctx.device)
    if run.float8.fsdp_all_gather:
        precompute_scales_after_step(model, optim.optimizer)
    if ctx.is_main:
        log.info("model %s: %.2fM params, mesh %s, engine %s", run.model.name, n_params / 1e6, dims.as_dict(), run.mesh.engine)
    extras = [] if run.train.standalone_layer is None else [StandaloneLayer(run.train.standalone_layer, dp_mesh.get_group())]
    setup = ProbeSetup(
        run=run, dims=dims, ctx=ctx, model=model, optim=optim, dp_mesh=dp_mesh, dp_group=dp_mesh.get_group(),
        tokens_per_sample=tokens_per_sample, flops_per_token=flops_per_token, extras=extras, run_dir=run_dir, probes=probes,
    )
    for probe in probes:
        probe.attach(setup)
    return Trainer(
        model=model, optim=optim, train=run.train, probes=probes, faults=Faults(run.fault, ctx.rank),
        dp_rank=dp_mesh.get_local_rank(), dp_group=dp_mesh.get_group(), device=ctx.device, on_step=on_step,
        accumulation=Accumulation(model, run.train.accum) if run.train.microbatches > 1 else None,
        extras=extras, reference=next((p.reference for p in probes if p.reference is not None), None), loss=loss,
    )


def _checkpointer(run: RunConfig, run_dir: Path, trainer: Trainer, ctx: DistContext, resume_from: Path | None) -> Checkpointer | None:
    """The run's checkpointer, the trainer restored from `resume_from` (None: no checkpoints)."""
    if run.checkpoint.kind == "none" and resume_from is None:
        return None
    checkpointer = Checkpointer(run, run_dir, trainer, ctx.rank, fault_point=trainer.faults.at)
    if resume_from is not None:
        checkpointer.load(resume_from)
    return checkpointer


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

    def publish(self, probes: list[Probe]) -> None:
        """The probes' own files and tables."""
        for probe in probes:
            probe.publish(Path(self.metrics.path.parent), self)

    def table(self, name: str, columns: list[str], rows: list[list]) -> None:
        if self.wandb is not None:
            self.wandb.log_table(name, columns, rows)

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
