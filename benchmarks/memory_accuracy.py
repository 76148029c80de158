"""Accuracy of the memory figures on GPUs: for each configuration, the estimate (`mode=estimate`,
one CPU process), the CUDA allocator's peak of a real run, and the module tracker's peak of its
step 2 against the allocator's peak of that step.

    python benchmarks/memory_accuracy.py                          # the default configurations, every visible GPU
    python benchmarks/memory_accuracy.py --config fsdp= --config tp2d=mesh.tp=2 -- train.batch_size=4

A configuration the estimator refuses (exit 2) still gets its real run and tracker figures, with
the refusal in the estimate column; one the lab refuses altogether is listed with the refusal. The real runs leave out the parity reference, so the allocator holds only the
measured model (plus cuBLAS workspace). Prints a Markdown table and writes it to --out."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from lab import run_lab  # noqa: E402

# The default transformer at a size that fills a few GB per GPU (~540M parameters, fp32).
MODEL = (
    "model.dim=2048", "model.n_layers=8", "model.n_heads=16", "model.ffn_dim=5632", "model.vocab_size=32000",
    "train.seq_len=1024", "train.batch_size=2",
)
CONFIGS = {
    "fsdp": "",
    "fsdp+ac": "ac.mode=full",
    "hsdp": "mesh.dp_replicate=2",
    "hsdp+ac": "mesh.dp_replicate=2 ac.mode=full",
    "tp2d": "mesh.tp=2",
    "tp2d+ac": "mesh.tp=2 ac.mode=full",
}
REAL_RUN = ("train.steps=3", "probes.memory.tracker=module", "probes.memory.tracker_step=2", "probes.parity.enabled=false", "logger=none")


def measure(name: str, overrides: list[str], world: int, out_dir: Path) -> dict:
    row = {"config": name, "overrides": " ".join(overrides)}
    est = run_lab("mode=estimate", f"mesh.world_size={world}", *overrides, "logger=none", run_dir=out_dir / f"{name}-estimate", timeout=1800)
    if est.returncode == 0:
        row["estimate_mib"] = json.loads((est.run_dir / "estimate.json").read_text())["peak_mib"]
    else:  # the tracker's accuracy is still worth measuring
        row["estimate_refused"] = (est.error_lines or est.stderr.splitlines()[-1:] or ["?"])[0]
    real = run_lab(*REAL_RUN, *overrides, run_dir=out_dir / f"{name}-run", timeout=1800)
    if real.returncode != 0:
        row["refused"] = (real.error_lines or ["run failed: see " + str(real.run_dir)])[0]
        return row
    report = json.loads((real.run_dir / "memory_breakdown.json").read_text())
    row.update(
        allocator_peak_mib=real.summary["memory"]["peak_mib"],
        tracker_peak_mib=report["peak_mib"],
        step_allocator_peak_mib=report["allocator_peak_mib"],
        untracked_mib=report["untracked_mib"],
        tracker_accuracy=report["tracker_accuracy"],
    )
    if "estimate_mib" in row:
        row["estimate_vs_allocator"] = row["estimate_mib"] / row["allocator_peak_mib"]
    return row


def markdown(rows: list[dict], world: int, gpu: str, common: list[str]) -> str:
    lines = [
        f"# Memory accuracy: {world} x {gpu}, torch {torch.__version__}",
        "",
        "Model: " + " ".join([*MODEL, *common]) + ". Peaks per rank in MiB (rank 0).",
        "",
        "| config | estimate | allocator peak | estimate / allocator | tracker peak (step 2) | allocator (step 2) "
        "| resident outside tracker | tracker / (allocator - resident) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "refused" in r:
            lines.append(f"| {r['config']} | {r['refused']} | | | | | | |")
            continue
        estimate = (f"{r['estimate_mib']:.0f} | {r['allocator_peak_mib']:.0f} | {r['estimate_vs_allocator']:.3f}" if "estimate_mib" in r
                    else f"{r['estimate_refused']} | {r['allocator_peak_mib']:.0f} |")
        lines.append(
            f"| {r['config']} | {estimate} "
            f"| {r['tracker_peak_mib']:.0f} | {r['step_allocator_peak_mib']:.0f} | {r['untracked_mib']:.0f} | {r['tracker_accuracy']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", action="append", default=[], metavar="NAME=OVERRIDES",
                        help="a configuration (space-separated overrides); repeatable; default: " + ", ".join(CONFIGS))
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "benchmarks" / "memory_accuracy")
    parser.add_argument("overrides", nargs="*", help="overrides for every configuration, after the model's")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("error: this benchmark compares estimates with the CUDA allocator: it needs GPUs")
    configs = dict(c.split("=", 1) for c in args.config) if args.config else CONFIGS
    world = torch.cuda.device_count()
    rows = []
    for name, extra in configs.items():
        rows.append(measure(name, [*MODEL, *extra.split(), *args.overrides], world, args.out))
        print(json.dumps(rows[-1]), flush=True)
    table = markdown(rows, world, torch.cuda.get_device_name(0), args.overrides)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "memory_accuracy.md").write_text(table)
    (args.out / "memory_accuracy.json").write_text(json.dumps(rows, indent=2))
    print(table)


if __name__ == "__main__":
    main()
