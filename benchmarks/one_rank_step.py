"""One rank's training step of an N-rank layout on one device, every collective faked: torch's fake process
group of N ranks with this process as rank 0 (a gather writes the rank's own shard into every rank's chunk, a
reduce-scatter the input's chunk on torch 2.13 and nothing on 2.11; nothing crosses a link, nothing waits for a peer). What the rank's own
streams cost without communication, at the shard sizes of N ranks: for a change to what a rank computes or
copies around its collectives (FSDP2's copy-in and copy-out) when fewer GPUs are lent than it runs on.
Not a prediction of the N-GPU step: no collective's time, no contention with one, no power shared.

    python benchmarks/one_rank_step.py --world 4 [--runs 2] [--json PATH] \\
        --variant packed= --variant in_place="fsdp.all_gather=in_place" [--versus packed] -- OVERRIDES

Each run is a fresh process (`python -m fsdp_lab`'s config, its model built and parallelized by the lab's
own build, the perf probe timing the steps), the variants alternated, each round in the reverse order of
the one before, as benchmarks/speed.py alternates; the table gives medians. The layout is taken as given:
`layout=auto` is resolved by the launch, which this skips, so pin the layout in OVERRIDES. Every run's
losses are kept, and the table's last column names the variants (itself included) whose losses every run of
this one matched step for step: variants that should compute the same numbers (the faked collectives are
deterministic) must name each other. Where torch's fake reduce-scatter leaves its output unwritten (2.11),
the updates from the second step on are not defined, and the first step's loss alone is compared."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def one_run(world: int, overrides: list[str]) -> dict:
    """In this process: rank 0 of a fake world of `world`, the run's steps, its figures."""
    from unittest import mock

    import torch

    from fsdp_lab.compose import prepared
    from fsdp_lab.dist import DistContext
    from fsdp_lab.estimate.fake_world import fake_world
    from fsdp_lab.probes.perf_probe import ThroughputProbe
    from fsdp_lab.worker import build_trainer

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.init()  # with the GPUs there are: what it checks per GPU must not see the count below
    # Checked as the N-GPU run it stands for: the check counts GPUs for the world, which is faked.
    with mock.patch("torch.cuda.device_count", return_value=world):
        run, dims = prepared(*overrides, "probes=off", "logger=none")
    if dims.world_size != world:
        sys.exit(f"the layout's world is {dims.world_size} ranks, not --world {world}: set mesh degrees that fill it")
    losses = []
    with fake_world(world, 0):
        if device.type == "cuda":
            torch.cuda.set_device(device)
        sentinel = torch.full((1,), -1.0, device=device)
        torch.distributed.reduce_scatter_tensor(sentinel, torch.ones(world, device=device))
        ctx = DistContext(rank=0, local_rank=0, world_size=world, device=device)
        trainer = build_trainer(run, dims, ctx, on_step=lambda row: losses.append(row["loss"]))
        trainer.run()
        perf = next(p for p in trainer.probes if isinstance(p, ThroughputProbe)).summary()["perf"]
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    return {"step_time_s": perf["step_time_s"], "tokens_per_s": perf["tokens_per_s"], "mfu": perf["mfu"], "host_step_s": perf["host_step_s"],
            "peak_mib": peak, "losses": losses, "overrides": overrides, "world": world,
            "steps": run.train.steps, "fake_reduce_scatter_writes": sentinel.item() != -1.0}


def run_in_fresh_process(world: int, overrides: list[str]) -> dict:
    result = subprocess.run([sys.executable, __file__, "--one-run", "--world", str(world), "--", *overrides],
                            capture_output=True, text=True, cwd=REPO)
    if result.returncode != 0:
        sys.exit(f"run failed ({' '.join(overrides)}):\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=OVERRIDES")
    parser.add_argument("--versus", help="the variant the ratios are against (default: the first)")
    parser.add_argument("--json")
    parser.add_argument("--one-run", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if args.one_run:
        print(json.dumps(one_run(args.world, args.overrides)), flush=True)
        return
    variants = dict(v.split("=", 1) for v in args.variant) or {"lab": ""}
    versus = args.versus or next(iter(variants))
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    for round_ in range(args.runs):
        order = list(variants) if round_ % 2 == 0 else list(variants)[::-1]
        for name in order:
            result = run_in_fresh_process(args.world, [*args.overrides, *variants[name].split()])
            runs[name].append(result)
            print(f"{name}: {result['tokens_per_s']:,.0f} tokens/s, step {result['step_time_s'] * 1e3:.1f} ms, "
                  f"host {result['host_step_s'] * 1e3:.1f} ms", flush=True)
    base = statistics.median(r["tokens_per_s"] for r in runs[versus])
    # torch 2.11's fake reduce-scatter leaves its output as it was (2.13's writes the input's chunk): from
    # the second step on, the updates are then whatever the gradients' buffers held, the same or not.
    # The first step's loss, forward through every gathered parameter, is defined on both.
    defined = all(r["fake_reduce_scatter_writes"] for results in runs.values() for r in results)
    compared = None if defined else 1
    print(f"\none rank of {args.world}, collectives faked; medians of {args.runs}")
    if not defined:
        print("this torch's fake reduce-scatter leaves its output unwritten: losses compared at the first step only")
    print(f"| variant | tokens/s (runs) | step ms | host ms | peak MiB | / {versus} | "
          f"{'every' if defined else 'the first'} step's loss the same as |")
    print("|---|---|---|---|---|---|---|")
    for name, results in runs.items():
        tokens = [r["tokens_per_s"] for r in results]
        peaks = [r["peak_mib"] for r in results if r["peak_mib"] is not None]
        same = [other for other, theirs in runs.items()
                if all(r["losses"][:compared] == theirs[0]["losses"][:compared] for r in results)]
        print(f"| {name} | {statistics.median(tokens):,.0f} ({', '.join(f'{t:,.0f}' for t in tokens)}) | "
              f"{statistics.median(r['step_time_s'] for r in results) * 1e3:.1f} | "
              f"{statistics.median(r['host_step_s'] for r in results) * 1e3:.1f} | {f'{max(peaks):,.0f}' if peaks else 'n/a'} | "
              f"{statistics.median(tokens) / base:.3f} | {', '.join(same) or 'none (its runs differ)'} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"world": args.world, "overrides": args.overrides, "variants": variants, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
