"""Accuracy of the memory figures on GPUs: for each configuration, the estimate (`mode=estimate`,
one CPU process), the CUDA allocator's peak of a real run on rank 0 and on its worst rank, and the
module tracker's peak of its step 2 against the allocator's peak of that step.

    python benchmarks/memory_accuracy.py                          # the default configurations, every visible GPU
    python benchmarks/memory_accuracy.py --config fsdp= --config tp2d=mesh.tp=2 -- train.batch_size=4
    python benchmarks/memory_accuracy.py --estimate-only          # the estimates alone (CPU; --world N)
    python benchmarks/memory_accuracy.py --measure-only --runs 4  # GPUs: the real runs alone, 4 at once
    python benchmarks/memory_accuracy.py --measure-only --set one-gpu --runs 6   # what one GPU can run
    python benchmarks/memory_accuracy.py --measured OUT/memory_accuracy.json   # CPU: estimates against them

The estimates run on the CPU, --jobs at a time, while the real runs take the GPUs, --runs at a time
(each process has its own caching allocator, so runs sharing the GPUs do not change each other's
peaks). The estimate needs no GPU: --measure-only on the GPU machine and --measured on any CPU
machine give the same table as one call, without the GPU machine's time spent on estimates.
A pipelined configuration (mesh.pp>1) runs without the module tracker, which cannot follow a
schedule; its estimate is per pp rank (rank 0's against rank 0, the largest against the worst rank).
A configuration the estimator refuses (exit 2) still gets its real run and tracker figures, with
the refusal in the estimate column; one the lab refuses altogether is listed with the refusal. The
real runs leave out the parity reference, so the allocator holds only the measured model (plus
cuBLAS workspaces). Prints a Markdown table and writes it to --out."""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
from fsdp_lab.cli_process import lab_env, run_lab  # noqa: E402

# The default transformer at a size that fills a few GB per GPU (~540M parameters).
MODEL = (
    "model.dim=2048", "model.n_layers=8", "model.n_heads=16", "model.ffn_dim=5632", "model.vocab_size=32000",
    "train.seq_len=1024", "train.batch_size=2",
)
# A transformers Llama of the same shape (random weights, nothing downloaded); heads not grouped.
HF_LLAMA = (
    "model=hf", "model.model_type=llama", "+model.config.hidden_size=2048", "+model.config.num_hidden_layers=8",
    "+model.config.num_attention_heads=16", "+model.config.num_key_value_heads=16",
    "+model.config.intermediate_size=5632", "+model.config.vocab_size=32000", "train.seq_len=1024", "train.batch_size=2",
)
BF16 = "fsdp.param_dtype=bfloat16 fsdp.reduce_dtype=float32"
PP2 = "mesh.pp=2 mesh.dp_shard=1 train.batch_size=4 train.microbatches=4"
CONFIGS = {
    "fsdp": "",
    "fsdp+ac": "ac.mode=full",
    "fsdp+bf16": BF16,
    "fsdp+bf16+ac": f"{BF16} ac.mode=full",
    "fsdp+bf16+sel-ac": f"{BF16} ac.mode=selective ac.selective=layer",
    "fsdp+bf16+accum4": f"{BF16} train.batch_size=4 train.microbatches=4",
    "hsdp": "mesh.dp_replicate=2",
    "hsdp+bf16+ac": f"mesh.dp_replicate=2 {BF16} ac.mode=full",
    "tp2d": "mesh.tp=2",
    "tp2d+ac": "mesh.tp=2 ac.mode=full",
    "tp2d+bf16": f"mesh.tp=2 {BF16}",
    "tp2d+sp+bf16": f"mesh.tp=2 mesh.sequence_parallel=true {BF16}",
    "tp2d+sp+bf16+sel-ac": f"mesh.tp=2 mesh.sequence_parallel=true {BF16} ac.mode=selective ac.selective=layer",
    "fsdp+bf16+long": f"{BF16} train.seq_len=4096 train.batch_size=1",
    "pp2+1f1b+bf16": f"{PP2} mesh.pp_schedule=1f1b {BF16}",
    "pp2+gpipe": f"{PP2} mesh.pp_schedule=gpipe",
    "hf-llama": " ".join(HF_LLAMA),
    "hf-llama+bf16": f"{' '.join(HF_LLAMA)} {BF16}",
    "hf-llama+bf16+ac": f"{' '.join(HF_LLAMA)} {BF16} ac.mode=full",
    "hf-llama+tp2d+bf16": f"{' '.join(HF_LLAMA)} mesh.tp=2 {BF16}",
}
# What one GPU can run (world size 1: FSDP over one rank); larger batches too, so that activations,
# not the gradients at the end of backward, make the peak.
ONE_GPU = {
    **{name: CONFIGS[name] for name in ("fsdp", "fsdp+ac", "fsdp+bf16", "fsdp+bf16+ac", "fsdp+bf16+sel-ac",
                                         "fsdp+bf16+accum4", "fsdp+bf16+long", "hf-llama")},
    "fsdp+bf16+b8": f"{BF16} train.batch_size=8",
    "fsdp+bf16+sel-ac+b8": f"{BF16} ac.mode=selective ac.selective=layer train.batch_size=8",
    "hf-llama+bf16+b8": f"{' '.join(HF_LLAMA)} {BF16} train.batch_size=8",
    "hf-llama+bf16+ac": CONFIGS["hf-llama+bf16+ac"],
}
CONFIG_SETS = {"default": CONFIGS, "one-gpu": ONE_GPU}
REAL_RUN = ("train.steps=3", "probes.parity.enabled=false", "logger=none")
# The module tracker cannot follow a pipeline schedule (a stage's forward runs once per microbatch):
# pipelined runs report the allocator's peak per rank alone.
TRACKED = ("probes.memory.tracker=module", "probes.memory.tracker_step=2")


def overrides_of(extra: str, common: list[str]) -> list[str]:
    """A configuration's overrides: the lab transformer's size unless it names another model."""
    model = () if any(o.startswith("model=") for o in extra.split()) else MODEL
    return [*model, *extra.split(), *common]


def dir_name(config: str) -> str:
    """A configuration's run directory: letters, digits, '-' and '_' only (so it copies anywhere)."""
    return config.replace("+", "_")


def first_error(result) -> str:
    return (result.error_lines or result.stderr.splitlines()[-1:] or ["?"])[0]


def estimate(name: str, overrides: list[str], world: int, out_dir: Path, device_memory_gib: float | None) -> dict:
    device = [f"estimate.device_memory_gib={device_memory_gib:.2f}"] if device_memory_gib else []
    # CPU only: the estimate needs no GPU, and must not take memory on the ones the real runs measure.
    est = run_lab("mode=estimate", f"mesh.world_size={world}", *overrides, *device, "logger=none",
                  run_dir=out_dir / f"{dir_name(name)}-estimate", timeout=1800, env=lab_env(CUDA_VISIBLE_DEVICES=""))
    if est.returncode != 0:  # the tracker's accuracy is still worth measuring
        return {"estimate_refused": first_error(est)}
    result = json.loads((est.run_dir / "estimate.json").read_text())
    per_rank = [r["peak_mib"] for r in result.get("pp_ranks", [])] or [result["peak_mib"]]
    return {"estimate_mib": per_rank[0], "estimate_worst_mib": max(per_rank), "fits": result["fits"]}


def measure(name: str, overrides: list[str], out_dir: Path) -> dict:
    pipelined = any(o.startswith("mesh.pp=") and o != "mesh.pp=1" for o in overrides)
    real = run_lab(*REAL_RUN, *(() if pipelined else TRACKED), *overrides, run_dir=out_dir / f"{dir_name(name)}-run", timeout=1800)
    if real.returncode != 0:
        return {"refused": first_error(real) if real.error_lines else f"run failed: {first_error(real)}"}
    memory = real.summary["memory"]
    ranks = memory.get("ranks_peak_mib") or [memory["peak_mib"]]
    row = {"allocator_peak_mib": memory["peak_mib"], "worst_rank_allocator_peak_mib": max(ranks), "ranks_allocator_peak_mib": ranks}
    if pipelined:
        return row
    report = json.loads((real.run_dir / "memory_breakdown.json").read_text())
    return {
        **row,
        "tracker_peak_mib": report["peak_mib"],
        "step_allocator_peak_mib": report["allocator_peak_mib"],
        "untracked_mib": report["untracked_mib"],
        "tracker_accuracy": report["tracker_accuracy"],
        "tracker_peak_categories_mib": report["peak_categories_mib"],
    }


def ratios(row: dict) -> dict:
    if "estimate_mib" not in row or "allocator_peak_mib" not in row:
        return {}
    return {"estimate_vs_allocator": row["estimate_mib"] / row["allocator_peak_mib"],
            "estimate_vs_worst_rank": row["estimate_worst_mib"] / row["worst_rank_allocator_peak_mib"]}


def _cells(r: dict) -> str:
    est = f"{r['estimate_mib']:.0f}" if "estimate_mib" in r else r.get("estimate_refused", "")
    if "refused" in r:
        return f"{est} | {r['refused']} | | | | | | |"
    if "allocator_peak_mib" not in r:  # --estimate-only
        return f"{est} | | | | | | | |"
    worst_est = f"{r['estimate_worst_mib']:.0f}" if "estimate_mib" in r else ""
    cells = [est, f"{r['allocator_peak_mib']:.0f}", f"{r.get('estimate_vs_allocator', 0):.3f}" if "estimate_mib" in r else "",
             f"{worst_est} / {r['worst_rank_allocator_peak_mib']:.0f}", f"{r['estimate_vs_worst_rank']:.3f}" if "estimate_mib" in r else ""]
    if "tracker_peak_mib" in r:
        cells += [f"{r['tracker_peak_mib']:.0f}", f"{r['untracked_mib']:.0f}", f"{r['tracker_accuracy']:.3f}"]
    else:
        cells += ["(pipeline: no tracker)", "", ""]
    return " | ".join(cells)


def markdown(rows: list[dict], world: int, gpu: str, torch_version: str, common: list[str]) -> str:
    lines = [
        f"# Memory accuracy: {world} x {gpu}, torch {torch_version} (estimates: mode=estimate on CPU)",
        "",
        "Model: " + " ".join([*MODEL, *common]) + " (hf-llama: " + " ".join(HF_LLAMA) + "). Peaks per rank in MiB.",
        "",
        "| config | estimate rank 0 | allocator peak rank 0 | estimate / rank 0 | estimate / allocator, worst rank "
        "| worst ratio | tracker peak (step 2) | resident outside tracker | tracker / (allocator - resident) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {r['config']} | {_cells(r)} |" for r in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", action="append", default=[], metavar="NAME=OVERRIDES",
                        help="a configuration (space-separated overrides); repeatable; default: " + ", ".join(CONFIGS))
    parser.add_argument("--set", choices=CONFIG_SETS, default="default", help="the configurations: default (2+ GPUs) or one-gpu")
    parser.add_argument("--only", help="comma-separated names of the set's configurations to run")
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "benchmarks" / "memory_accuracy")
    parser.add_argument("--jobs", type=int, default=4, help="estimates running at once on the CPU")
    parser.add_argument("--runs", type=int, default=1, help="real runs at once on the GPUs (each process has its own allocator)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--estimate-only", action="store_true", help="no real runs (no GPU needed)")
    mode.add_argument("--measure-only", action="store_true", help="no estimates: the real runs alone (combine later with --measured)")
    mode.add_argument("--measured", type=Path, metavar="JSON", help="no real runs: estimate here (CPU) against a --measure-only run's memory_accuracy.json")
    parser.add_argument("--world", type=int, help="world size (default: the visible GPUs)")
    parser.add_argument("overrides", nargs="*", help="overrides for every configuration, after the model's")
    args = parser.parse_args()
    measured = json.loads(args.measured.read_text()) if args.measured else None
    on_gpu = not (args.estimate_only or measured)
    if on_gpu and not torch.cuda.is_available():
        sys.exit("error: this benchmark compares estimates with the CUDA allocator: it needs GPUs (or --estimate-only / --measured)")
    configs = dict(c.split("=", 1) for c in args.config) if args.config else CONFIG_SETS[args.set]
    if args.only:
        configs = {name: configs[name] for name in args.only.split(",")}
    if measured:
        world, gpu, torch_version = measured["world"], measured["gpu"], measured["torch"]
        memory_gib, common = measured["device_memory_gib"], measured["common_overrides"]
        configs = {r["config"]: r["extra"] for r in measured["rows"]}
    else:
        world = args.world or (torch.cuda.device_count() if on_gpu else 2)
        gpu = torch.cuda.get_device_name(0) if on_gpu else "no GPU"
        torch_version = torch.__version__
        memory_gib = torch.cuda.get_device_properties(0).total_memory / 2**30 if on_gpu else None
        common = args.overrides
    overrides = {name: overrides_of(extra, common) for name, extra in configs.items()}
    with ThreadPoolExecutor(args.jobs) as estimates_pool, ThreadPoolExecutor(args.runs) as runs_pool:
        estimates = {} if args.measure_only else {
            name: estimates_pool.submit(estimate, name, o, world, args.out, memory_gib) for name, o in overrides.items()}
        runs = {name: runs_pool.submit(measure, name, o, args.out) for name, o in overrides.items()} if on_gpu else {}
        for name, run in runs.items():  # as each finishes: a log cut short still holds the runs that ended
            run.add_done_callback(lambda f, name=name: print(json.dumps({"config": name, "measured": f.result()}), flush=True))
        earlier = {r["config"]: r for r in measured["rows"]} if measured else {}
        rows = []
        for name, o in overrides.items():
            row = {**earlier.get(name, {}), "config": name, "extra": configs[name], "overrides": " ".join(o)}
            if name in runs:
                row.update(runs[name].result())
            if name in estimates:
                row.update(estimates[name].result())
            row.update(ratios(row))
            rows.append(row)
            print(json.dumps(row), flush=True)
    table = markdown(rows, world, gpu, torch_version, common)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "memory_accuracy.md").write_text(table)
    (args.out / "memory_accuracy.json").write_text(json.dumps({
        "world": world, "gpu": gpu, "torch": torch_version, "device_memory_gib": memory_gib,
        "common_overrides": common, "rows": rows}, indent=2))
    print(table)


if __name__ == "__main__":
    main()
