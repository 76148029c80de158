"""The yardstick: a minimal hand-written FSDP2 training loop, as a user would write it, over the same
model the lab trains. Run with torchrun; prints one JSON line (rank 0) with median step time,
tokens/s per GPU and peak memory. `--dp-replicate R` makes it HSDP (R replicas), `--tp T` 2D with
PyTorch's tensor-parallel tutorial plan (Megatron-style, local tensors between the layers)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from yardstick_loop import init_process_group, parse_args, time_steps

from fsdp_lab.models.transformer import TransformerConfig
from fsdp_lab.models.transformer import Transformer


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def main() -> None:
    a = parse_args(__doc__)
    device = init_process_group()
    shard = dist.get_world_size() // (a.dp_replicate * a.tp)
    mesh = init_device_mesh(device.type, (a.dp_replicate, shard, a.tp), mesh_dim_names=("dp_replicate", "dp_shard", "tp"))
    dp_mesh = mesh["dp_replicate", "dp_shard"] if a.dp_replicate > 1 else mesh["dp_shard"]
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(dim=a.dim, n_layers=a.n_layers, n_heads=a.n_heads,
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
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    time_steps(model, opt, cross_entropy, a, device)


if __name__ == "__main__":
    main()
