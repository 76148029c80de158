"""Tensor parallelism: one declarative plan per model (module path -> ParallelStyle), applied with
`parallelize_module` over the tp mesh before FSDP shards the result over dp (2D, as torchtitan does).

A plan is two dicts: one for the root's own modules (embeddings, final norm, output), one applied to
every block. Pipeline stages reuse the same plans: root entries whose module a stage lacks are skipped."""

from __future__ import annotations

import logging

from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

log = logging.getLogger(__name__)

Plan = dict[str, object]


def transformer_plan(sequence_parallel: bool) -> tuple[Plan, Plan]:
    """Megatron-style: q/k/v and w1/w3 split by output (heads, hidden units), wo and w2 by input, so
    each attention or MLP costs one all-reduce; the embedding is split by vocabulary rows and the
    output by vocabulary columns, its logits gathered for the loss. With sequence parallelism the
    activations between those layers stay sharded along the sequence (dim 1), norms included."""
    seq = Shard(1) if sequence_parallel else Replicate()
    root: Plan = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
        "output": ColwiseParallel(input_layouts=seq, output_layouts=Replicate()),
    }
    block: Plan = {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=seq),
        "feed_forward.w1": hidden_colwise(),
        "feed_forward.w3": hidden_colwise(),
        "feed_forward.w2": RowwiseParallel(output_layouts=seq),
    }
    if sequence_parallel:
        root["norm"] = SequenceParallel()
        block.update({
            "attention_norm": SequenceParallel(),
            "ffn_norm": SequenceParallel(),
            # The projections need the whole sequence: all-gather it on the way in (cos/sin pass as is).
            "attention": PrepareModuleInput(input_layouts=(seq, None, None), desired_input_layouts=(Replicate(), None, None)),
            "feed_forward": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
        })
    return root, block


def hidden_colwise() -> ColwiseParallel:
    """Column-wise for a layer whose output only feeds elementwise ops and a row-wise layer: the
    output stays a DTensor, which knows its global size, so an odd hidden size splits unevenly
    (17 = 9 + 8) where a plain local tensor would be taken for an even split."""
    return ColwiseParallel(use_local_output=False)


def mlp_pair() -> Plan:
    return {"in_proj": hidden_colwise(), "out_proj": RowwiseParallel()}


TP_PLANS = {
    "transformer": transformer_plan,
    "mlp_stack": lambda sequence_parallel: ({}, mlp_pair()),
    "mlp": lambda sequence_parallel: (mlp_pair(), {}),
}


def apply_tp(model: nn.Module, tp_mesh, model_name: str, sequence_parallel: bool) -> None:
    root_plan, block_plan = TP_PLANS[model_name](sequence_parallel)
    children = dict(model.named_children())
    root_plan = {path: style for path, style in root_plan.items() if path in children}
    if root_plan:
        parallelize_module(model, tp_mesh, root_plan)
    for block in model.blocks:
        parallelize_module(block, tp_mesh, block_plan)
    log.info("tp: %s plan over %d ranks, %d blocks, sequence_parallel=%s", model_name, tp_mesh.size(), len(model.blocks), sequence_parallel)
