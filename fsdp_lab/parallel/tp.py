"""Tensor parallelism: one declarative plan per model (module path -> ParallelStyle), applied with
`parallelize_module` over the tp mesh before FSDP shards the result over dp (2D, as torchtitan does).

A plan is two dicts: one for the root's own modules (embeddings, final norm, output), one applied to
every block. Pipeline stages reuse the same plans: root entries whose module a stage lacks are skipped."""

from __future__ import annotations

import copy
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
        "feed_forward.w1": HiddenColwise(),
        "feed_forward.w3": HiddenColwise(),
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


class HiddenColwise(ColwiseParallel):
    """Column-wise for a layer whose output only feeds elementwise ops and a row-wise layer.

    Where the output splits evenly over the tp ranks it leaves as a plain local tensor, as in
    PyTorch's own TP plans: the elementwise ops between the two layers then skip DTensor dispatch,
    whose host time bounds the 2D step of a model as small as the 0.95B benchmark's.
    An uneven split (17 = 9 + 8) keeps the DTensor, which knows its global size, where a local
    tensor would be taken by the row-wise layer for an even split."""

    def _apply(self, module: nn.Module, device_mesh):
        style = copy.copy(self)  # one style serves every block: decide per module on a copy
        style.use_local_output = module.out_features % device_mesh.size() == 0
        return ColwiseParallel._apply(style, module, device_mesh)


def mlp_pair() -> Plan:
    return {"in_proj": HiddenColwise(), "out_proj": RowwiseParallel()}


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
