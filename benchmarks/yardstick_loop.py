"""What the hand-written loops share (fsdp2_yardstick.py, torchtitan_yardstick.py): the model's shape
on the command line, the process group, and the timed loop, clipped as torchtitan's trainer clips,
that prints one JSON line (rank 0)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from fsdp_lab.probes.profile import ProfileWindow, write_ops_table

MAX_NORM = 1.0
"""Every step clips the gradient to this norm, as torchtitan's trainer does (training.max_norm=1.0,
with torch's clip_grad_norm_) and the lab's bench_llama1b (optim.max_norm=1.0): all peers pay for it."""

SHAPE = (("dim", 2048), ("n_layers", 16), ("n_heads", 16), ("ffn_dim", 5632), ("vocab_size", 32000),
         ("seq_len", 2048), ("batch_size", 4), ("steps", 20), ("warmup", 5), ("dp_replicate", 1), ("tp", 1))


def parse_args(description: str, **choices: tuple[str, ...]) -> argparse.Namespace:
    """The bench_llama1b shape by default; `--dp-replicate R` makes it HSDP, `--tp T` 2D; each of
    `choices` adds `--NAME`, its first value the default."""
    p = argparse.ArgumentParser(description=description)
    for name, default in SHAPE:
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--profile", type=Path, help="profile the last 2 warm-up steps into this directory (ops.md, traces)")
    for name, allowed in choices.items():
        p.add_argument(f"--{name}", choices=allowed, default=allowed[0])
    a = p.parse_args()
    if a.profile and a.warmup < 2:
        p.error(f"--profile profiles the last 2 warm-up steps: --warmup={a.warmup} must be >= 2")
    return a


def init_process_group() -> torch.device:
    """One process per GPU under torchrun (gloo on CPU, where the loops can be tried on tiny shapes)."""
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return device


def time_steps(model, optimizer, loss_fn, a: argparse.Namespace, device: torch.device,
               around_backward=contextlib.nullcontext) -> None:
    """Random tokens, `a.steps` steps (each clipped to MAX_NORM), the median of those after
    `a.warmup`; rank 0 prints step_time_s, host_step_s (the host's time to issue a step, to
    zero_grad, as the lab's perf.host_step_s), tokens_per_s (per GPU: a tp group shares one batch), peak_mib and params.
    Each step's loss is read after the next step is issued, as torchtitan's trainer (which reads it
    on logging steps only) and the lab's bench_llama1b (train.overlap_steps) run: a step's time is
    from its start to the next step's (the last one's, to its loss).
    `around_backward`: the context the loss and its backward run in. With `a.profile`, the last 2
    warm-up steps run under torch.profiler (as the lab's probes.profile does), outside the timed ones."""
    tokens = torch.randint(0, a.vocab_size, (a.batch_size, a.seq_len + 1), device=device)
    window = ProfileWindow(device) if a.profile else None
    starts, issued = [], []  # each step's start, and when the host had issued it (before reading a loss)
    unread = None
    for step in range(a.steps):
        if window and step == a.warmup - 2:
            window.begin()
        starts.append(time.perf_counter())
        logits = model(tokens[:, :-1])
        with around_backward():
            loss = loss_fn(logits, tokens[:, 1:])
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        issued.append(time.perf_counter())
        if unread is not None:
            unread.item()
        unread = loss.detach()
        if window and step == a.warmup - 1:
            window.end(a.profile, dist.get_rank(), steps=2)
            if dist.get_rank() == 0:
                write_ops_table(a.profile / "ops.md", window.ops, f"Rank 0, steps {step}-{step + 1}, self time on {device.type}")
    unread.item()
    times = [end - start for start, end in zip(starts, [*starts[1:], time.perf_counter()])][a.warmup :]
    step_time = statistics.median(times)
    host_step = statistics.median([end - start for start, end in zip(starts, issued)][a.warmup :])
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else 0.0
    if dist.get_rank() == 0:
        print(json.dumps({"step_time_s": step_time, "host_step_s": host_step, "tokens_per_s": a.batch_size * a.seq_len / a.tp / step_time,
                          "peak_mib": peak, "loss": loss.item(),
                          "params": sum(p.numel() for p in model.parameters())}), flush=True)
    dist.destroy_process_group()
