"""mode=estimate under op-level selective activation checkpointing (ac=selective ac.selective=op),
which the recomputation used to break (`profiler._record_function_enter_new ... not found in storage`,
FSDP2's cast of a checkpointed block's inputs entering a profiler range): it is estimated, and keeping
the matmul outputs holds more than recomputing everything and less than checkpointing nothing."""

from __future__ import annotations

from fsdp_lab.estimate import estimate
from fsdp_lab.plan.trace import quiet

SHAPE = ["mode=estimate", "mesh.dp_shard=2", "fsdp.param_dtype=bfloat16", "model.dim=128", "model.n_heads=4", "model.ffn_dim=256",
         "model.n_layers=2", "model.vocab_size=512", "train.seq_len=128", "train.batch_size=4", "logger=none",
         "wrap.policy=classes", "wrap.classes=[Embedding,TransformerBlock]"]


def _peak(prepared, *ac: str) -> float:
    run, dims = prepared(*SHAPE, *ac)
    with quiet():
        return estimate(run, dims)["traced_peak_mib"]


def test_op_level_selective_ac_is_estimated_between_none_and_full(prepared):
    op = _peak(prepared, "ac=selective", "ac.selective=op", "ac.every=1")
    assert _peak(prepared, "ac=full") < op < _peak(prepared, "ac=none")
