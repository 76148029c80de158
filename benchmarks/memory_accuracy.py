"""Accuracy of the memory figures on GPUs: for each configuration, the estimate (`mode=estimate`,
one CPU process), the CUDA allocator's peak of a real run on rank 0 and on its worst rank, and the
module tracker's peak of its step 2 against the allocator's peak of that step.

    python benchmarks/memory_accuracy.py                          # the default configurations, every visible GPU
    python benchmarks/memory_accuracy.py --config fsdp= --config tp2d=mesh.tp=2 -- train.batch_size=4
    python benchmarks/memory_accuracy.py --estimate-only          # the estimates alone (CPU; --world N)

The estimates run on the CPU, --jobs at a time, while the real runs take the GPUs one after another.
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
sys.path.insert(0, str(REPO / "tests"))
from lab import lab_env, run_lab  # noqa: E402

# The default transformer at a size that fills a few GB per GPU (~540M parameters).
MODEL = (
    "model.dim=2048", "model.n_layers=8", "model.n_heads=16", "model.ffn_dim=5632", "model.vocab_size=32000",
    "train.seq_len=1024", "train.batch_size=2",
)
BF16 = "fsdp.param_dtype=bfloat16 fsdp.reduce_dtype=float32"
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
}
REAL_RUN = ("train.steps=3", "probes.memory.tracker=module", "probes.memory.tracker_step=2", "probes.parity.enabled=false", "logger=none")


def first_error(result) -> str:
    return (result.error_lines or result.stderr.splitlines()[-1:] or ["?"])[0]


def estimate(name: str, overrides: list[str], world: int, out_dir: Path, device_memory_gib: float | None) -> dict:
    device = [f"estimate.device_memory_gib={device_memory_gib:.2f}"] if device_memory_gib else []
    # CPU only: the estimate needs no GPU, and must not take memory on the ones the real runs measure.
    est = run_lab("mode=estimate", f"mesh.world_size={world}", *overrides, *device, "logger=none",
                  run_dir=out_dir / f"{name}-estimate", timeout=1800, env=lab_env(CUDA_VISIBLE_DEVICES=""))
    if est.returncode != 0:  # the tracker's accuracy is still worth measuring
        return {"estimate_refused": first_error(est)}
    result = json.loads((est.run_dir / "estimate.json").read_text())
    return {"estimate_mib": result["peak_mib"], "fits": result["fits"]}


def measure(name: str, overrides: list[str], out_dir: Path) -> dict:
    real = run_lab(*REAL_RUN, *overrides, run_dir=out_dir / f"{name}-run", timeout=1800)
    if real.returncode != 0:
        return {"refused": first_error(real) if real.error_lines else f"run failed: see {real.run_dir}"}
    report = json.loads((real.run_dir / "memory_breakdown.json").read_text())
    return {
        "allocator_peak_mib": real.summary["memory"]["peak_mib"],
        "worst_rank_allocator_peak_mib": max(r["allocator_peak_mib"] for r in report["ranks"]),
        "tracker_peak_mib": report["peak_mib"],
        "step_allocator_peak_mib": report["allocator_peak_mib"],
        "untracked_mib": report["untracked_mib"],
        "tracker_accuracy": report["tracker_accuracy"],
    }


def ratios(row: dict) -> dict:
    if "estimate_mib" not in row or "allocator_peak_mib" not in row:
        return {}
    return {"estimate_vs_allocator": row["estimate_mib"] / row["allocator_peak_mib"],
            "estimate_vs_worst_rank": row["estimate_mib"] / row["worst_rank_allocator_peak_mib"]}


def markdown(rows: list[dict], world: int, gpu: str, common: list[str]) -> str:
    lines = [
        f"# Memory accuracy: {world} x {gpu}, torch {torch.__version__}",
        "",
        "Model: " + " ".join([*MODEL, *common]) + ". Peaks per rank in MiB.",
        "",
        "| config | estimate | allocator peak rank 0 | estimate / rank 0 | allocator peak worst rank | estimate / worst rank "
        "| tracker peak (step 2) | resident outside tracker | tracker / (allocator - resident) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "refused" in r:
            lines.append(f"| {r['config']} | {r.get('estimate_mib', r.get('estimate_refused', ''))} | {r['refused']} | | | | | | |")
            continue
        if "allocator_peak_mib" not in r:  # --estimate-only
            lines.append(f"| {r['config']} | {r['estimate_mib']:.0f} | | | | | | | |" if "estimate_mib" in r
                         else f"| {r['config']} | {r['estimate_refused']} | | | | | | | |")
            continue
        if "estimate_mib" in r:
            est = (f"{r['estimate_mib']:.0f} | {r['allocator_peak_mib']:.0f} | {r['estimate_vs_allocator']:.3f} "
                   f"| {r['worst_rank_allocator_peak_mib']:.0f} | {r['estimate_vs_worst_rank']:.3f}")
        else:
            est = f"{r['estimate_refused']} | {r['allocator_peak_mib']:.0f} | | {r['worst_rank_allocator_peak_mib']:.0f} |"
        lines.append(f"| {r['config']} | {est} | {r['tracker_peak_mib']:.0f} | {r['untracked_mib']:.0f} | {r['tracker_accuracy']:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", action="append", default=[], metavar="NAME=OVERRIDES",
                        help="a configuration (space-separated overrides); repeatable; default: " + ", ".join(CONFIGS))
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "benchmarks" / "memory_accuracy")
    parser.add_argument("--jobs", type=int, default=4, help="estimates running at once on the CPU")
    parser.add_argument("--estimate-only", action="store_true", help="no real runs (no GPU needed)")
    parser.add_argument("--world", type=int, help="world size (default: the visible GPUs)")
    parser.add_argument("overrides", nargs="*", help="overrides for every configuration, after the model's")
    args = parser.parse_args()
    on_gpu = not args.estimate_only
    if on_gpu and not torch.cuda.is_available():
        sys.exit("error: this benchmark compares estimates with the CUDA allocator: it needs GPUs (or --estimate-only)")
    configs = dict(c.split("=", 1) for c in args.config) if args.config else CONFIGS
    world = args.world or (torch.cuda.device_count() if on_gpu else 2)
    gpu = torch.cuda.get_device_name(0) if on_gpu else "no GPU"
    memory_gib = torch.cuda.get_device_properties(0).total_memory / 2**30 if on_gpu else None
    overrides = {name: [*MODEL, *extra.split(), *args.overrides] for name, extra in configs.items()}
    with ThreadPoolExecutor(args.jobs) as pool:
        estimates = {name: pool.submit(estimate, name, o, world, args.out, memory_gib) for name, o in overrides.items()}
        rows = []
        for name, o in overrides.items():
            row = {"config": name, "overrides": " ".join(o), **(measure(name, o, args.out) if on_gpu else {})}
            row.update(estimates[name].result())
            row.update(ratios(row))
            rows.append(row)
            print(json.dumps(row), flush=True)
    table = markdown(rows, world, gpu, args.overrides)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "memory_accuracy.md").write_text(table)
    (args.out / "memory_accuracy.json").write_text(json.dumps(rows, indent=2))
    print(table)


if __name__ == "__main__":
    main()
