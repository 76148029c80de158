"""The lab's training step against the hand-written FSDP2 yardstick, on the same GPUs in one
invocation: `python benchmarks/speed.py [--compile] [extra lab overrides]`.

Runs the lab (`+experiment=bench_llama1b`, probes off, then with the memory probe on for the peak),
then the yardstick under torchrun, and prints tokens/s, step time, MFU and peak memory side by side."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from lab import run_lab  # noqa: E402


def lab(overrides: list[str]) -> dict:
    """summary.json of `python -m fsdp_lab +experiment=bench_llama1b OVERRIDES`; exits if the run fails."""
    result = run_lab("+experiment=bench_llama1b", *overrides, timeout=1800)
    if result.returncode != 0:
        sys.exit(f"lab run failed ({' '.join(overrides)}):\n{result.stderr[-3000:]}")
    return result.summary


def yardstick(gpus: int, args: list[str]) -> dict:
    """The hand-written loop (benchmarks/fsdp2_yardstick.py ARGS) under torchrun on `gpus` GPUs."""
    return json.loads(subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={gpus}", "benchmarks/fsdp2_yardstick.py", *args],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.strip().splitlines()[-1])


def main() -> None:
    compile_ = "--compile" in sys.argv
    extra = [a for a in sys.argv[1:] if a != "--compile"] + (["model.compile=true"] if compile_ else [])
    gpus = torch.cuda.device_count()
    bare = lab(extra)["perf"]
    with_memory = lab([*extra, "probes.memory.enabled=true"])
    yard = yardstick(gpus, ["--compile"] if compile_ else [])
    rows = [
        ("tokens/s per GPU", bare["tokens_per_s"], yard["tokens_per_s"]),
        ("step time (s)", bare["step_time_s"], yard["step_time_s"]),
        ("peak memory (MiB)", with_memory["memory"]["peak_mib"], yard["peak_mib"]),
    ]
    print(f"{gpus} GPUs, compile={compile_}, params {yard['params'] / 1e9:.3f}B, lab MFU {bare['mfu']:.3f}, "
          f"lab with memory probe {with_memory['perf']['tokens_per_s']:.0f} tokens/s")
    print(f"{'':20} {'lab':>12} {'yardstick':>12} {'lab/yard':>9}")
    for name, ours, theirs in rows:
        print(f"{name:20} {ours:12.4g} {theirs:12.4g} {ours / theirs:9.3f}")


if __name__ == "__main__":
    main()
