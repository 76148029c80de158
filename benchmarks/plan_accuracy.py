"""How close `mode=plan`'s step-time prediction is to real runs: a fixed set of configurations on the
visible GPUs, each run by the lab (probes off but memory, so the step is the bare loop), each predicted
by the plan's model in this process, printed side by side with the error.

    python benchmarks/plan_accuracy.py --out accuracy/              # GPUs: measure, then predict
    python benchmarks/plan_accuracy.py --measure-only --out accuracy/
    python benchmarks/plan_accuracy.py --predict-from accuracy/measured.json --device h200 --gpus-per-node 8

Measured rows are written to OUT/measured.json as they come (a cut-off run keeps what it measured);
the table goes to OUT/accuracy.md."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from lab import run_lab  # noqa: E402

COMMON = ("fsdp.param_dtype=bfloat16", "fsdp.reduce_dtype=float32", "train.seq_len=2048", "train.steps=6",
          "probes.perf.warmup_steps=3", "probes.parity.enabled=false", "logger=none")
LLAMA_1B = ("model.dim=2048", "model.n_layers=16", "model.n_heads=16", "model.ffn_dim=5632", "model.vocab_size=32000")
LLAMA_150M = ("model.dim=1024", "model.n_layers=8", "model.n_heads=8", "model.ffn_dim=2816", "model.vocab_size=32000")
LAYOUTS = {"fsdp": (), "hsdp": ("mesh.dp_replicate=2",), "tp2d": ("mesh.tp=2",)}
# name -> (model, layout, extra overrides); batch 4 per dp rank (tp2d: 8, the same tokens per GPU pair)
CONFIGS = {  # the most telling first: a run cut off by a time limit keeps these
    "1b fsdp": (LLAMA_1B, "fsdp", ()),
    "150m fsdp": (LLAMA_150M, "fsdp", ()),
    "1b tp2d": (LLAMA_1B, "tp2d", ("train.batch_size=8",)),
    "1b hsdp": (LLAMA_1B, "hsdp", ()),
    "1b fsdp ac": (LLAMA_1B, "fsdp", ("ac=full",)),
    "150m tp2d": (LLAMA_150M, "tp2d", ("train.batch_size=8",)),
    "150m hsdp ac": (LLAMA_150M, "hsdp", ("ac=full",)),
    "1b fsdp compile": (LLAMA_1B, "fsdp", ("model.compile=true",)),
    "150m fsdp ac": (LLAMA_150M, "fsdp", ("ac=full",)),
    "1b fsdp no-reshard": (LLAMA_1B, "fsdp", ("fsdp.reshard_after_forward=false",)),
    "1b fsdp mb2": (LLAMA_1B, "fsdp", ("train.microbatches=2",)),
    "150m fsdp compile": (LLAMA_150M, "fsdp", ("model.compile=true",)),
    "1b tp2d compile": (LLAMA_1B, "tp2d", ("train.batch_size=8", "model.compile=true")),
}


def overrides_of(name: str) -> list[str]:
    model, layout, extra = CONFIGS[name]
    return [*model, *COMMON, "train.batch_size=4", *LAYOUTS[layout], *extra]


def measure(out: Path, names: list[str]) -> list[dict]:
    rows = []
    for name in names:
        result = run_lab(*overrides_of(name), timeout=600)
        row = {"config": name, "overrides": overrides_of(name)}
        if result.returncode != 0:
            row["error"] = (result.error_lines or result.stderr.splitlines()[-3:] or ["?"])[-1]
        else:
            s = result.summary
            row.update(step_time_s=s["perf"]["step_time_s"], peak_mib=s["memory"]["peak_mib"], mfu=s["perf"]["mfu"],
                       tokens_per_s=s["perf"]["tokens_per_s"], world_size=s["world_size"])
        rows.append(row)
        print(json.dumps(row), flush=True)
        (out / "measured.json").write_text(json.dumps(rows, indent=1))
    return rows


def predict(rows: list[dict], device: str, gpus_per_node: int) -> list[dict]:
    from fsdp_lab.plan.predict import predict_overrides

    for row in rows:
        p = predict_overrides(row["overrides"], world_size=row.get("world_size", 2), device=device, gpus_per_node=gpus_per_node)
        row.update(predicted_step_time_s=p["step_time_s"], predicted_peak_mib=p["peak_mib"], host_bound=p["host_bound"])
        if row.get("step_time_s"):
            row["error"] = p["step_time_s"] / row["step_time_s"] - 1
    return rows


def markdown(rows: list[dict], device: str) -> str:
    lines = [f"Predicted ({device} table) vs measured step time and peak memory per GPU, 2 GPUs.", "",
             "| config | measured step (ms) | predicted (ms) | error | measured peak MiB | predicted MiB | host-bound |",
             "|---|---|---|---|---|---|---|"]
    errors = []
    for r in rows:
        if "step_time_s" not in r:
            lines.append(f"| {r['config']} | failed: {r.get('error')} | | | | | |")
            continue
        errors.append(abs(r["error"]))
        lines.append(f"| {r['config']} | {r['step_time_s'] * 1e3:.1f} | {r['predicted_step_time_s'] * 1e3:.1f} | {r['error']:+.1%} "
                     f"| {r['peak_mib']:.0f} | {r['predicted_peak_mib']:.0f} | {'yes' if r['host_bound'] else ''} |")
    if errors:
        lines += ["", f"median |error| {statistics.median(errors):.1%}, max {max(errors):.1%}, over {len(errors)} configurations"]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=REPO / "outputs" / "plan_accuracy")
    p.add_argument("--measure-only", action="store_true")
    p.add_argument("--predict-from", type=Path, help="measured.json of an earlier run: predict only")
    p.add_argument("--device", default="h200")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--only", nargs="*", help="configuration names (default: all)")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = json.loads(args.predict_from.read_text()) if args.predict_from else measure(args.out, args.only or list(CONFIGS))
    if args.measure_only:
        return
    rows = predict(rows, args.device, args.gpus_per_node)
    table = markdown(rows, args.device)
    (args.out / "accuracy.json").write_text(json.dumps(rows, indent=1))
    (args.out / "accuracy.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
