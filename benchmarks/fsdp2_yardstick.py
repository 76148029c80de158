"""The yardstick: a minimal hand-written FSDP2 training loop, as a user would write it, over the same
model the lab trains. Run with torchrun; prints one JSON line (rank 0) with median step time,
tokens/s per GPU and peak memory. `--dp-replicate R` makes it HSDP (R replicas), `--tp T` 2D with
PyTorch's tensor-parallel tutorial plan (Megatron-style, local tensors between the layers)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from fsdp_lab.config import ModelConfig
from fsdp_lab.models.transformer import Transformer


def main() -> None:
    p = argparse.ArgumentParser()
    for name, default in (("dim", 2048), ("n_layers", 16), ("n_heads", 16), ("ffn_dim", 5632), ("vocab_size", 32000),
                          ("seq_len", 2048), ("batch_size", 4), ("steps", 20), ("warmup", 5), ("dp_replicate", 1), ("tp", 1)):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    p.add_argument("--compile", action="store_true")
    a = p.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    shard = dist.get_world_size() // (a.dp_replicate * a.tp)
    mesh = init_device_mesh("cuda", (a.dp_replicate, shard, a.tp), mesh_dim_names=("dp_replicate", "dp_shard", "tp"))
    dp_mesh = mesh["dp_replicate", "dp_shard"] if a.dp_replicate > 1 else mesh["dp_shard"]
    torch.manual_seed(0)
    model = Transformer(ModelConfig(name="transformer", dim=a.dim, n_layers=a.n_layers, n_heads=a.n_heads,
                                    ffn_dim=a.ffn_dim, vocab_size=a.vocab_size))
    if a.tp > 1:
        parallelize_module(model, mesh["tp"], {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
            "output": ColwiseParallel(output_layouts=Replicate()),
        })
        for block in model.layers:
            parallelize_module(block, mesh["tp"], {
                "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
                "attention.wo": RowwiseParallel(),
                "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel(),
            })
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.layers:
        if a.compile:
            block.compile()
        fully_shard(block, mesh=dp_mesh, mp_policy=mp)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    tokens = torch.randint(0, a.vocab_size, (a.batch_size, a.seq_len + 1), device="cuda")

    times = []
    for step in range(a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    step_time = statistics.median(times)
    if dist.get_rank() == 0:
        print(json.dumps({"step_time_s": step_time, "tokens_per_s": a.batch_size * a.seq_len / a.tp / step_time,
                          "peak_mib": torch.cuda.max_memory_allocated() / 2**20,
                          "params": sum(p.numel() for p in model.parameters())}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
