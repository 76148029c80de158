"""The lab's training step beside torchtitan's and a hand-written FSDP2 loop, on the same GPUs, model
shape and precision, in one invocation per mode:

    python benchmarks/speed.py [--compile] [--ac none|full] [--shape 1b|8b] [--float8 none|tensorwise|rowwise] [--runs 3] [--peers lab,torchtitan,hand-written]
                               [--variant NAME=OVERRIDES ...] [--peer-path DIR] [--json PATH] [--profile DIR [--profile-runs first|all]]
                               [--gpu-clocks CSV]
                               [extra lab overrides]

Each run is a fresh process; the runs of the peers alternate, each round in the reverse order of the
one before (lab, torchtitan, torchtitan, lab, lab, torchtitan, ...), so that a machine that speeds up
or slows down through the invocation favours no peer (in a fixed order the last peer of each round
would always run latest), and the table shows medians. Each run records its place in the
invocation (`at`, in --json). The lab runs
`+experiment=bench_llama1b`, compiled `+experiment=bench_llama1b_compiled` (shape 8b: Llama-3-8B's
sizes with full multi-head attention, batch 1, seq 4096) with the per-phase memory probe on for its
peak (it costs no measurable time): at 1b in the experiment's own layout (eager
`fsdp.reshard_after_forward=false wrap.group=4`, compiled resharding two blocks to a unit), at 8b
resharding (LAYOUT: the fastest that fits under torchtitan's peak). --float8 RECIPE: torchao's float8
linears in the lab (FLOAT8; at 8b two blocks to a unit) and in torchtitan (its float8 converter, tensorwise
gathering its weights in float8,
the output projection left in bf16 by both). Each peer's host ms/step is its host's time to issue
a step, before it reads a loss. torchtitan
(benchmarks/torchtitan_yardstick.py) runs with DIR (where its wheels were installed) on its path.
--ac full: every block checkpointed in the lab (ac=full) and in torchtitan (its --ac full; the
hand-written loop has no checkpointing, so it is refused there), for shapes that fit only so.
--profile DIR: each peer's first run profiles its last 2 warm-up steps (the lab through probes.profile)
into DIR/<peer>/: ops.md, the ops ranked by GPU time per step, and every rank's trace. With
--profile-runs all, every run does, into DIR/<peer>/run<k>/: a slow run's profile beside a fast one's
of the same invocation (the profiled steps are warm-up steps, before the timed ones).
--variant NAME=OVERRIDES (repeatable): the lab once more with these space-separated overrides, as
the peer `lab:NAME`, alternated with the others: a change's A/B in one invocation, beside the peers.
A variant with `layout=auto` runs without the mode's hand-set layout; one with `train.global_batch_size=N`
runs without the shape's per-GPU batch, so that layout=auto also picks the samples per data-parallel
rank (at 8b on 4 GPUs, `train.global_batch_size=4` keeps torchtitan's tokens a step and lets tensor
parallel take two sequences a rank).
--gpu-clocks CSV: nvidia-smi samples every GPU's SM clock, power and clock-event reasons each second into
CSV, and each run prints (and keeps, in --json) its GPUs' means over its steps (benchmarks/gpu_clocks.py).
Each run records when it started and ended (`started`, `ended`, in --json).
--versus lab:NAME: the variants' ratios against that variant rather than the lab (with --peers leaving
the lab out: float8 under layout=auto against bf16, `--variant bf16="float8.recipe=none" --versus lab:bf16`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
from fsdp_lab.cli_process import run_lab  # noqa: E402
import gpu_clocks  # noqa: E402  (benchmarks/, this script's directory)
from yardstick_loop import SHAPE  # noqa: E402

SHAPES = {
    "1b": {},  # the experiment's own: dim 2048, 16 layers, 16 heads, ffn 5632, vocab 32000, seq 2048, batch 4
    "8b": {"dim": 4096, "n_layers": 32, "n_heads": 32, "ffn_dim": 14336, "vocab_size": 128256,
           "seq_len": 4096, "batch_size": 1, "steps": 12, "warmup": 4},
    "tiny": {"dim": 64, "n_layers": 2, "n_heads": 4, "ffn_dim": 192, "vocab_size": 256,  # tries the script on CPU
             "seq_len": 32, "batch_size": 2, "steps": 5, "warmup": 2},
}
LAB_KEY = {"seq_len": "train.seq_len", "batch_size": "train.batch_size", "steps": "train.steps",
           "warmup": "probes.perf.warmup_steps"}
# The lab's layout where it is not the experiments' (the 1b ones carry theirs: bench_llama1b and
# bench_llama1b_compiled), the fastest that stays under torchtitan's peak memory. At 8b the blocks'
# gathered bf16 weights would add about 14.5 GiB (7.8B parameters, by count; not measured), above
# torchtitan's peak there: it reshards.
RESHARDED = ["fsdp.reshard_after_forward=true", "wrap.group=1"]  # at 8b: as measured before the experiment kept blocks gathered
LAYOUT = {("8b", False): RESHARDED, ("8b", True): RESHARDED}
# --float8: the lab's overrides per recipe; torchtitan's yardstick takes --float8 RECIPE (its tensorwise
# gathers weights in float8). The lab's tensorwise gathers bf16: at 8b compiled on 4xH100 (2026-11-26)
# gathering float8 ran at the same speed (9,423 against 9,391 tokens/s, medians of 2) and held 3.7 GiB
# more, above torchtitan's peak. Two blocks to a unit at 8b (the compiled experiment's own layout):
# float8's host work per FSDP unit made one block to a unit 8.5% slower (8,615 against 9,347, one run
# each); two hold 0.7 GiB more.
FLOAT8 = {"tensorwise": ["float8.recipe=tensorwise"], "rowwise": ["float8.recipe=rowwise"]}
FLOAT8_LAYOUT = {("8b", True): []}
PEERS = ("lab", "torchtitan", "hand-written")
SCRIPT = {"torchtitan": "benchmarks/torchtitan_yardstick.py", "hand-written": "benchmarks/fsdp2_yardstick.py"}


def profile_dir_of(root: Path | None, name: str, run: int, every: bool) -> Path | None:
    """Where a peer's run puts its profile, if it takes one."""
    if root is None or (run and not every):
        return None
    peer_dir = root / name.replace(":", "-")
    return peer_dir / f"run{run}" if every else peer_dir


def lab(overrides: list[str], warmup: int, profile_dir: Path | None = None, experiment: str = "bench_llama1b") -> dict:
    """tokens/s, MFU and peak memory of `python -m fsdp_lab +experiment=EXPERIMENT OVERRIDES`;
    with `profile_dir`, its profile/ of the last 2 warm-up steps (as the peers') copied there."""
    if profile_dir:
        overrides = [*overrides, "probes.profile.enabled=true", f"probes.profile.first_step={warmup - 1}", "probes.profile.steps=2"]
    result = lab_run(overrides, experiment)
    if profile_dir:
        shutil.copytree(result.run_dir / "profile", profile_dir, dirs_exist_ok=True)
    s = result.summary
    # The overrides too, and under layout=auto what it chose (summary.json's `layout`):
    # benchmarks/plan_accuracy.py --predict-from can then put the plan beside the run.
    return {"tokens_per_s": s["perf"]["tokens_per_s"], "mfu": s["perf"]["mfu"], "peak_mib": s["memory"]["peak_mib"],
            "host_step_s": s["perf"]["host_step_s"], "step_time_s": s["perf"]["step_time_s"], "overrides": lab_args(overrides, experiment),
            **({"layout": s["layout"]} if "layout" in s else {})}


def own_layout(overrides: list[str], layout: list[str], variant: list[str]) -> list[str]:
    """The lab's overrides for a variant: one that lets the plan choose (layout=auto) runs without the
    mode's hand-set layout, which it would keep as pinned, so that it chooses among every layout. One
    that sets train.global_batch_size runs without the shape's per-GPU train.batch_size: its tokens a
    step are the variant's to say, and layout=auto then picks the samples per data-parallel rank too
    (tensor-parallel layouts give each such rank more than one GPU's share)."""
    if "layout=auto" in variant:
        overrides = [o for o in overrides if o not in layout]
    if any(o.startswith("train.global_batch_size=") for o in variant):
        overrides = [o for o in overrides if not o.startswith("train.batch_size=")]
    return overrides + variant


def lab_args(overrides: list[str], experiment: str = "bench_llama1b") -> list[str]:
    """What a lab run of the benchmark is: `python -m fsdp_lab` with these, the memory probe on."""
    return [f"+experiment={experiment}", "probes.memory.enabled=true", *overrides]


def lab_run(overrides: list[str], experiment: str = "bench_llama1b"):
    """`python -m fsdp_lab +experiment=EXPERIMENT OVERRIDES` with the memory probe on, finished (or exit)."""
    result = run_lab(*lab_args(overrides, experiment), timeout=1800)
    if result.returncode != 0:
        sys.exit(f"lab run failed ({' '.join(overrides)}):\n{result.stderr[-3000:]}")
    return result


def peer(name: str, gpus: int, args: list[str], peer_path: str | None) -> dict:
    """A yardstick script under torchrun on `gpus` GPUs; its last stdout line is its JSON."""
    env = dict(os.environ)
    if name == "torchtitan" and peer_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (peer_path, env.get("PYTHONPATH")) if p)
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={gpus}", SCRIPT[name], *args],
        cwd=REPO, capture_output=True, text=True, env=env,
    )
    if result.returncode != 0:
        sys.exit(f"{name} run failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def medians_of(runs: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    """Each peer's median tokens/s, peak and host time per step over the runs it made (and MFU, with a
    lab run among them)."""
    medians = {name: {key: statistics.median(r[key] for r in rs) for key in ("tokens_per_s", "peak_mib", "host_step_s")
                      if all(r.get(key) is not None for r in rs)}
               for name, rs in runs.items() if rs}
    # The same model and FLOPs per token in every peer: MFU scales with tokens/s. The lab's runs (any
    # of its columns: an invocation may run only variants) give the rate.
    lab_runs = [r for name, rs in runs.items() if name == "lab" or name.startswith("lab:") for r in rs if r.get("mfu")]
    if lab_runs:
        flops_rate = statistics.median(r["mfu"] / r["tokens_per_s"] for r in lab_runs)
        for m in medians.values():
            m["mfu"] = m["tokens_per_s"] * flops_rate
    return medians


def ratio_columns(peers: list[str], variants: dict[str, list[str]], versus: str) -> list[tuple[str, str]]:
    """(numerator, denominator) of the table's ratios: each lab column against each peer that is not the
    lab, and each variant against `versus` (the lab, or another variant: float8's against bf16's)."""
    labs = [name for name in peers if name == "lab" or name in variants]
    against_peers = [(mine, n) for mine in labs for n in peers if n not in labs]
    against_versus = [(mine, versus) for mine in labs if mine in variants and mine != versus and versus in peers]
    return against_peers + against_versus


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compile", action="store_true", help="per-block torch.compile in every peer")
    p.add_argument("--ac", choices=("none", "full"), default="none", help="activation checkpointing of every block")
    p.add_argument("--shape", choices=SHAPES, default="1b")
    p.add_argument("--float8", choices=("none", *FLOAT8), default="none",
                   help="float8 linears (torchao) in the lab and torchtitan; the hand-written loop has none")
    p.add_argument("--runs", type=int, default=3, help="fresh processes per peer; the table shows medians")
    p.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated, of {', '.join(PEERS)}")
    p.add_argument("--peer-path", help="directory holding torchtitan and its dependencies")
    p.add_argument("--json", type=Path, help="also write every run's figures here, after each run")
    p.add_argument("--profile", type=Path, help="profile each peer's first run into DIR/<peer>/")
    p.add_argument("--profile-runs", choices=("first", "all"), default="first",
                   help="with --profile: each peer's first run, or every run into DIR/<peer>/run<k>/")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=OVERRIDES",
                   help="also run the lab with these space-separated overrides, as the peer lab:NAME")
    p.add_argument("--gpu-clocks", type=Path, metavar="CSV", help="sample the GPUs' clocks and power into CSV; each run reports its own")
    p.add_argument("--versus", default="lab", metavar="COLUMN",
                   help="the column each variant's ratios are taken against: lab (the default) or lab:NAME")
    a, extra = p.parse_known_args()
    variants = {}
    for v in a.variant:
        name, _, overrides = v.partition("=")
        if not name or not overrides.split():
            p.error(f"--variant={v}: expected NAME=OVERRIDES, the lab's overrides separated by spaces")
        variants[f"lab:{name}"] = overrides.split()
    peers = [name for name in PEERS if name in a.peers.split(",")] + list(variants)
    if a.versus not in ("lab", *variants):
        p.error(f"--versus={a.versus}: expected lab or one of the variants ({', '.join(variants) or 'none given'})")
    if a.profile_runs == "all" and not a.profile:
        p.error("--profile-runs=all: profiles go under --profile DIR; give it one")
    if a.gpu_clocks and not shutil.which("nvidia-smi"):
        p.error(f"--gpu-clocks={a.gpu_clocks}: needs nvidia-smi, which this machine lacks")
    for flag, value in (("ac", a.ac), ("float8", a.float8)):
        if value != "none" and "hand-written" in peers:
            p.error(f"--{flag}={value}: the hand-written loop has no such option; leave it out of --peers")
    # The yardsticks' warm-up unless the shape sets one, given to the lab too: both time, and
    # profile, the same steps.
    shape = {"warmup": dict(SHAPE)["warmup"], **SHAPES[a.shape]}
    gpus = torch.cuda.device_count() or 2  # 2 gloo ranks on a CPU-only machine
    layouts = FLOAT8_LAYOUT if a.float8 != "none" and (a.shape, a.compile) in FLOAT8_LAYOUT else LAYOUT
    layout = layouts.get((a.shape, a.compile), [])
    extra = layout + extra  # printed with the table: the lab's overrides beyond the shape
    # Compiled, the experiment that carries the compiled 1b layout (as a user runs it).
    experiment = "bench_llama1b_compiled" if a.compile else "bench_llama1b"
    lab_overrides = [f"{LAB_KEY.get(k, 'model.' + k)}={v}" for k, v in shape.items()] + extra
    args = [f"--{k.replace('_', '-')}={v}" for k, v in shape.items()]
    # Said either way, so that a layout=auto variant keeps the mode's compile rather than choosing it.
    lab_overrides.append(f"model.compile={str(a.compile).lower()}")
    if a.compile:
        args.append("--compile")
    if a.ac != "none":
        lab_overrides.append(f"ac={a.ac}")
        args.append(f"--ac={a.ac}")
    if a.float8 != "none":
        lab_overrides += FLOAT8[a.float8]
        args.append(f"--float8={a.float8}")

    runs: dict[str, list[dict]] = {name: [] for name in peers}
    with gpu_clocks.sampling(a.gpu_clocks) if a.gpu_clocks else contextlib.nullcontext():
        for run in range(a.runs):
            for name in peers if run % 2 == 0 else peers[::-1]:
                profile_dir = profile_dir_of(a.profile, name, run, every=a.profile_runs == "all")
                started = time.time()
                if name == "lab" or name in variants:
                    figures = lab(own_layout(lab_overrides, layout, variants.get(name, [])), shape["warmup"], profile_dir, experiment)
                else:
                    figures = peer(name, gpus, args + ([f"--profile={profile_dir}"] if profile_dir else []), a.peer_path)
                # The run's whole process time (start-up, compiling, layout=auto's planning): what an
                # invocation costs on a metered machine, per peer.
                ended = time.time()
                wall_s = ended - started
                figures.update(at=sum(map(len, runs.values())), wall_s=wall_s, started=started, ended=ended)
                runs[name].append(figures)
                plan_s = figures.get("layout", {}).get("plan_s")  # layout=auto's share of the run's start
                print(f"{name:13} {figures['tokens_per_s']:10.0f} tokens/s  {figures['peak_mib']:9.0f} MiB  {wall_s:6.0f} s"
                      + (f" (planning {plan_s:g} s)" if plan_s is not None else ""), flush=True)
                if a.gpu_clocks:  # the samples up to now: this run's are in
                    figures["gpu_clocks"] = gpu_clocks.during(gpu_clocks.read(a.gpu_clocks), figures["started"], figures["ended"])
                    print(gpu_clocks.line(name, figures["tokens_per_s"], figures["gpu_clocks"]), flush=True)
                if a.json:  # after every run: an invocation cut off by a time limit keeps the runs it made
                    a.json.write_text(json.dumps({"gpus": gpus, "compile": a.compile, "shape": a.shape, "float8": a.float8, "extra": extra,
                                                  "runs": runs, "medians": medians_of(runs)}, indent=1))
    medians = medians_of(runs)

    print(f"\n{gpus} GPUs, shape {a.shape}, compile={a.compile}, ac={a.ac}, float8={a.float8}, medians of {a.runs} runs{' ' + ' '.join(extra) if extra else ''}")
    ratios = ratio_columns(peers, variants, a.versus)
    width = max([18] + [len(f"{num}/{den}") + 2 for num, den in ratios])
    print(f"{'':18}" + "".join(f"{name:>14}" for name in peers) + "".join(f"{num + '/' + den:>{width}}" for num, den in ratios))
    for key, label, fmt, scale in (("tokens_per_s", "tokens/s per GPU", "{:14.0f}", 1), ("mfu", "MFU", "{:14.3f}", 1),
                                   ("peak_mib", "peak memory (MiB)", "{:14.0f}", 1), ("host_step_s", "host ms/step", "{:14.1f}", 1e3)):
        if key not in medians[peers[0]]:
            continue
        row = "".join(fmt.format(medians[name][key] * scale) if key in medians[name] else f"{'-':>14}" for name in peers)
        row += "".join(f"{medians[num][key] / medians[den][key]:{width}.3f}" if medians[den].get(key) and key in medians[num]
                       else f"{'-':>{width}}" for num, den in ratios)
        print(f"{label:18}{row}")
    print("(host ms/step: the host's time to issue a step, before reading a loss; near the step's own time, "
          "the step waits for its host)")


if __name__ == "__main__":
    main()
