"""One rank of the clipping, schedule and localisation matrix (4 ranks, started once by torch elastic from
tests/test_clip_schedule_localize.py through matrix_rank.launch). Rank 0 writes {label: result} as JSON:

- clip/<mesh>: SGD with a small optim.max_norm on fsdp, hsdp, fsdp1, ddp, tp2d and a pipelined mesh;
- clip/<mesh>/local_norm: the same with the norm taken over each rank's local shard only (the
  sums over mesh dimensions skipped): the parity verdict must catch it;
- resume: a cosine schedule with warm-up, saved at step 2 and resumed to step 4, beside the same
  run uninterrupted;
- localize/<case>: a corrupt_grad fault in a block in the middle of the transformer, or in a
  pipelined run, and what the localisation report names."""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
from pathlib import Path
from unittest import mock

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from fsdp_lab import optim
from fsdp_lab.checkpoint import Checkpointer, step_dir_name
from fsdp_lab.dist import init_distributed
from fsdp_lab.summary import probe_sections
from fsdp_lab.worker import build_trainer
from training import run_and_mesh, train

TINY = [
    "debug=cpu_tiny", "model.n_layers=4", "train.batch_size=4", "train.microbatches=2", "train.steps=3",
    "probes.parity.param_every=1", "probes.perf.enabled=false", "probes.memory.enabled=false",
]
# SGD: Adam's scale invariance would hide a wrong clipping coefficient. The norm is ~0.5: it clips.
CLIP = ["optim=sgd", "optim.lr=0.1", "optim.max_norm=0.05", "train.steps=2", "model.n_layers=2"]
MESHES = {
    "fsdp": ["mesh=fsdp"],
    "hsdp": ["mesh=hsdp"],
    "fsdp1": ["mesh=fsdp", "mesh.engine=fsdp1"],
    "ddp": ["mesh=ddp"],
    "tp2d": ["mesh=tp2d"],
    "pp": ["mesh=fsdp", "mesh.pp=2"],
}
LOCAL_NORM = ("fsdp", "tp2d")
SCHEDULE = ["optim.schedule=cosine", "optim.warmup_steps=1", "train.steps=4", "checkpoint=dcp", "checkpoint.interval=2"]
CORRUPT = ["fault.kind=corrupt_grad", "fault.at_step=1"]
LOCALIZE = {
    # A block in the middle of a 4-block transformer; replayed from before the failing step.
    "fsdp_block": ["mesh=fsdp", *CORRUPT, "fault.module=layers.2", "fault.kill_rank=1", "probes.parity.localize=true"],
    # The same, replayed on the parameters the failing step left (localize off: found at the failure).
    "fsdp_block_after": ["mesh=fsdp", *CORRUPT, "fault.module=layers.2", "fault.kill_rank=1"],
    # pp=2 x dp=2: layers 2-3 live on pp rank 1, global ranks 2 and 3.
    "pp": ["mesh=fsdp", "mesh.pp=2", *CORRUPT, "fault.module=layers.2.feed_forward.w2", "fault.kill_rank=2", "probes.parity.localize=true"],
}


@contextlib.contextmanager
def local_norm_only():
    """Break the gradient norm on purpose: no sum over the mesh dimensions a gradient is sharded on."""
    with mock.patch.object(optim, "_reduce_over", lambda value, groups: value):
        yield


def clip_result(overrides: list[str], ctx) -> dict:
    _, trainer, rows = train(TINY + CLIP + overrides, ctx)
    return {"parity": trainer.reference.verdict.as_summary(), "rows": rows}


def local_params(model) -> list[torch.Tensor]:
    return [(p.to_local() if isinstance(p, DTensor) else p).detach().clone() for p in model.parameters()]


def resume_result(ctx, run_dir: Path) -> dict:
    """Uninterrupted 4 steps vs 2 steps, then a fresh trainer resumed from step 2's checkpoint."""
    run, dims = run_and_mesh(TINY + SCHEDULE, ctx)
    whole_rows, resumed_rows = [], []
    whole = build_trainer(run, dims, ctx, on_step=whole_rows.append)
    whole.run(0, Checkpointer(run, run_dir, whole, ctx.rank, fault_point=whole.faults.at))
    resumed = build_trainer(run, dims, ctx, on_step=resumed_rows.append)
    checkpointer = Checkpointer(run, run_dir / "resumed", resumed, ctx.rank, fault_point=resumed.faults.at)
    start = checkpointer.load(run_dir / "checkpoints" / step_dir_name(2))
    resumed.run(start, checkpointer)
    # The model only: the DDP reference rebuilds its gradient buckets after its first step, so a
    # resumed reference sums 4 ranks' gradients in another order (last bits) than an uninterrupted one.
    same = all(torch.equal(a, b) for a, b in zip(local_params(whole.model), local_params(resumed.model)))
    flag = torch.tensor([int(same)])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return {
        "whole": whole_rows, "resumed": resumed_rows, "start": start, "params_bitwise_equal": bool(flag.item()),
        "schedules": [t.scheduler.state_dict()["last_epoch"] for t in (whole, resumed, whole.reference, resumed.reference)],
    }


def localize_result(overrides: list[str], ctx, run_dir: Path) -> dict:
    run_dir.mkdir(parents=True, exist_ok=True)
    _, trainer, rows = train(TINY + overrides, ctx, run_dir=run_dir)
    return {"parity": probe_sections(trainer.probes)["parity"], "report_files": sorted(p.name for p in run_dir.iterdir()), "rows": rows}


def main(out_path: str) -> None:
    ctx = init_distributed("cpu", timeout_s=120)
    work = Path(out_path).parent / "runs"
    results = {}

    def record(label: str, compute) -> None:
        if ctx.is_main:  # a failure's traceback follows the variant it belongs to
            print("variant", label, flush=True)
        results[label] = compute()

    for name, overrides in MESHES.items():
        record(f"clip/{name}", lambda: clip_result(overrides, ctx))
    for name in LOCAL_NORM:
        with local_norm_only():
            record(f"clip/{name}/local_norm", lambda: clip_result(MESHES[name], ctx))
    record("resume", lambda: resume_result(ctx, work / "resume"))
    for name, overrides in LOCALIZE.items():
        record(f"localize/{name}", lambda: localize_result(overrides, ctx, work / name))
    if ctx.is_main:
        Path(out_path).write_text(json.dumps(results, indent=1))
        shutil.rmtree(work / "resume", ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1])
