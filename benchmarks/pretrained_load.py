"""model.pretrained=DIR: host memory per rank while loading a checkpoint, and the time to the first
step. Writes a Llama-shaped checkpoint with transformers' own save_pretrained (if DIR has none),
then trains one step on `--ranks` ranks (parity off: its reference would hold the whole model), each
rank reporting what it read, its resident set before and at its peak during the load, its shard
and the largest decoder block, as JSON and a table.

    python benchmarks/pretrained_load.py --dir /tmp/llama_medium --shape medium --ranks 2      # CPU, ~170M params
    python benchmarks/pretrained_load.py --dir /data/llama3_8b --shape llama3-8b --ranks 8 \\
        --overrides mesh=fsdp device=cuda fsdp.param_dtype=bfloat16                            # 8 GPUs
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Also in spawned ranks (GPU), which import this file again but do not run its main.
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]
SHAPES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=256),
    "medium": dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
                   vocab_size=32000),
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                      vocab_size=128256, rope_theta=500000.0, max_position_embeddings=8192),
}


def write_checkpoint(directory: Path, shape: str, max_shard_size: str) -> None:
    """A randomly initialised Llama of `shape`, saved by transformers in bfloat16 (sharded files + index)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("llama", **SHAPES[shape])
    with torch.device("cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(directory, max_shard_size=max_shard_size)


def rank_entry(overrides: list[str], out_path: str) -> None:
    import torch
    import torch.distributed as dist

    from fsdp_lab.dist import init_distributed, resolve_device_type
    from fsdp_lab.models import build_meta
    from fsdp_lab.worker import build_trainer
    from hf_families import composer

    started = time.perf_counter()
    ctx = init_distributed(resolve_device_type("auto"), 1200)
    run, dims = composer()(*overrides)
    meta = build_meta(run.model)
    params = sum(p.numel() * p.element_size() for p in meta.parameters())
    block = max(sum(p.numel() * p.element_size() for p in b.parameters()) for b in meta.blocks)
    del meta
    trainer = build_trainer(run, dims, ctx, on_step=lambda row: None)
    stats = dict(trainer.model.pretrained_load)
    trainer.run()
    if ctx.device.type == "cuda":
        torch.cuda.synchronize()
    stats.update(rank=ctx.rank, first_step_s=time.perf_counter() - started, shard_mib=params / dims.dp_shard / dims.tp / 2**20,
                 block_mib=block / 2**20, whole_mib=params / 2**20)
    gathered = [None] * ctx.world_size
    dist.all_gather_object(gathered, stats)
    if ctx.is_main:
        Path(out_path).write_text(json.dumps(gathered, indent=1))


def table(rows: list[dict]) -> str:
    lines = ["| rank | read MiB | largest slice MiB | RSS before | RSS peak | peak - before | file-backed RSS after | shard + block MiB "
             "| load s | to first step s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['rank']} | {r['read_mib']:.1f} | {r['largest_slice_mib']:.1f} | {r['rss_before_mib']:.0f} | "
                     f"{r['rss_peak_mib']:.0f} | {r['rss_peak_mib'] - r['rss_before_mib']:.1f} | {r['rss_file_mib']:.0f} | "
                     f"{r['shard_mib'] + r['block_mib']:.1f} | {r['seconds']:.2f} | {r['first_step_s']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    from fsdp_lab.dist import resolve_device_type
    from fsdp_lab.spawn import child_start_method, launch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="checkpoint directory (written if it holds no config.json)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="medium")
    parser.add_argument("--max-shard-size", default="200MB")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--overrides", nargs="*", default=["mesh=fsdp"], help="lab overrides (mesh, device, dtypes)")
    parser.add_argument("--out", default="outputs/pretrained_load/rows.json")
    args = parser.parse_args()
    directory, out = Path(args.dir), Path(args.out).resolve()
    if not (directory / "config.json").exists():
        t0 = time.perf_counter()
        write_checkpoint(directory, args.shape, args.max_shard_size)
        print(f"wrote {directory} ({args.shape}) in {time.perf_counter() - t0:.1f} s", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    overrides = ["model=hf", f"model.pretrained={directory}", "train.steps=1", "train.seq_len=128", "train.batch_size=1",
                 "probes.parity.enabled=false", "probes.perf.enabled=false", "logger=none", f"mesh.cpu_world_size={args.ranks}",
                 *args.overrides]
    launch(rank_entry, (overrides, str(out)), n=args.ranks, run_dir=out.parent, max_restarts=0,
           start_method=child_start_method(resolve_device_type("auto")))
    rows = json.loads(out.read_text())
    print(table(rows))
    print(f"rows: {out}")


if __name__ == "__main__":
    main()
