"""Peak memory per GPU of one layout, in closed form from the traces' estimated peaks.

A trace's peak (the estimate's, FSDPMemTracker on the fake device) splits into what does not grow
with the batch (states, buffers) and activations per sample: P(blocks, samples) = S + samples x A,
read off the 1- and 2-sample traces, and per block from the 1- and 2-block ones. A layout then swaps
the trace's sharded states for its own (params and Adam state, 12 bytes per parameter in fp32, over
its shard group and tp), scales S and A to its depth, divides TP's share of the activations, holds
every block's unsharded parameters when it does not reshard after forward, and keeps up to pp
microbatches in flight in a pipeline."""

from __future__ import annotations

from fsdp_lab.plan.cost import TP_REPLICATED_ELEMENTWISE, Layout, Model
from fsdp_lab.plan.trace import TRACE_WORLD

STATE_BYTES = 12  # fp32 parameter + exp_avg + exp_avg_sq, sharded


def peak_bytes(model: Model, layout: Layout) -> float:
    t = model.traces
    unit = model.block_params / model.layers
    traced_states = {L: (L * unit + model.other_params) * STATE_BYTES / TRACE_WORLD for L in (1, 2)}
    # A block more adds its states and its activations per sample; the states are known, so the rest
    # is the activations (under AC: the block's input only; the recomputed block is in the constant).
    per_block = max(t[(2, 1)].peak_bytes - t[(1, 1)].peak_bytes - unit * STATE_BYTES / TRACE_WORLD, 0.0)
    per_sample_2 = t[(2, 2)].peak_bytes - t[(2, 1)].peak_bytes
    per_sample_rest = per_sample_2 - 2 * per_block
    fixed = t[(2, 1)].peak_bytes - traced_states[2] - per_sample_2
    L = model.layers // layout.pp
    act = (per_sample_rest + L * per_block) * (TP_REPLICATED_ELEMENTWISE + (1 - TP_REPLICATED_ELEMENTWISE) / layout.tp)
    in_flight = min(layout.microbatches, layout.pp) if layout.pp > 1 else 1
    states = (L * unit + model.other_params) / layout.tp / layout.dp_shard * STATE_BYTES
    unsharded = 0.0 if layout.reshard or layout.dp_shard == 1 else max(L - 2, 0) * unit / layout.tp * model.param_bytes
    return states + fixed / layout.tp + unsharded + act * layout.microbatch_size * in_flight
