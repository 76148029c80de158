"""What checksumming a checkpoint's files costs a save, on CPU: the lab's Checkpointer saves a model of
--mb MB with its AdamW state (one gloo rank, this process), alternately with the manifest's checksums
and without them (sizes only), and prints the median save times and the overhead.

    python benchmarks/checkpoint_checksum.py --mb 128 --repeats 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

import fsdp_lab.checkpoint as checkpoint
from fsdp_lab.config import CheckpointConfig, RunConfig


def model_of(mb: int) -> torch.nn.Module:
    layers = max(1, mb * 2**20 // (4 * 1024 * 1024))
    return torch.nn.Sequential(*[torch.nn.Linear(1024, 1024, bias=False) for _ in range(layers)])


def timed_save(saver: checkpoint.Checkpointer, step: int) -> float:
    start = time.perf_counter()
    saver.save(step)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=128, help="model size in MB (fp32 parameters)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29517"))
    dist.init_process_group("gloo", rank=0, world_size=1)
    model = model_of(args.mb)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 1024)).sum().backward()
    optimizer.step()  # creates the optimizer state, which is saved too
    trainer = SimpleNamespace(
        model=model, optimizer=optimizer, reference=None, last_loss=0.0,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0),
        data=SimpleNamespace(next_sample=lambda step: 0),
    )
    run = RunConfig(checkpoint=CheckpointConfig(kind="dcp", keep=1))
    with_crc = checkpoint.checksums
    times: dict[str, list[float]] = {"with checksums": [], "without": []}
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as run_dir:
        saver = checkpoint.Checkpointer(run, Path(run_dir), trainer, rank=0, fault_point=lambda step, phase: None)
        for step in range(1, 2 * args.repeats + 1):
            label = "with checksums" if step % 2 else "without"
            checkpoint.checksums = with_crc if step % 2 else (lambda directory, names: dict.fromkeys(names))
            times[label].append(timed_save(saver, step))
        last = checkpoint.complete_checkpoints(Path(run_dir))[-1]
        files = [str(p.relative_to(last)) for p in last.rglob("*") if p.is_file()]
        size = sum((last / name).stat().st_size for name in files)
        start = time.perf_counter()
        with_crc(last, files)  # the checksum pass alone, the part the saves differ by
        crc_s = time.perf_counter() - start
    with_s, without_s = (statistics.median(times[k]) for k in ("with checksums", "without"))
    print(f"checkpoint of {size / 1e6:.0f} MB ({sum(p.numel() for p in model.parameters()) * 4 / 1e6:.0f} MB of parameters), "
          f"{args.repeats} saves each, median: with checksums {with_s:.3f} s, without {without_s:.3f} s, "
          f"overhead {100 * (with_s / without_s - 1):+.1f}%; the checksum pass alone {crc_s:.3f} s "
          f"= {100 * crc_s / without_s:.1f}% of a save without")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
