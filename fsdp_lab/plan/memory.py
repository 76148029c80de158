"""Peak memory per GPU of one layout, in closed form from the traces' estimated peaks.

A trace's peak (the estimate's, FSDPMemTracker on the fake device) splits into what does not grow
with the batch (states, buffers) and activations per sample: P(blocks, samples) = S + samples x A,
read off the 1- and 2-sample traces. A layout then swaps the trace's sharded states for its own
(params and Adam state, 12 bytes per parameter in fp32, over its shard group and tp), scales S and
A to its depth, divides TP's share of the activations, holds every block's unsharded parameters
when it does not reshard after forward, and keeps up to pp microbatches in flight in a pipeline."""

from __future__ import annotations

from fsdp_lab.plan.cost import TP_REPLICATED_ELEMENTWISE, Layout, Model
from fsdp_lab.plan.trace import TRACE_WORLD

STATE_BYTES = 12  # fp32 parameter + exp_avg + exp_avg_sq, sharded


def _fwd_bytes(trace) -> float:
    return sum(o.dims[0] for o in trace.ops if o.kind == "mem" and o.phase == "fwd")


def peak_bytes(model: Model, layout: Layout) -> float:
    t = model.traces
    act2 = t[(2, 2)].peak_bytes - t[(2, 1)].peak_bytes
    # One block's activations per sample, in the share its forward traffic bears to two blocks'.
    act1 = act2 * _fwd_bytes(t[(1, 1)]) / _fwd_bytes(t[(2, 1)])
    unit = model.block_params / model.layers
    traced_states = {L: (L * unit + model.other_params) * STATE_BYTES / TRACE_WORLD for L in (1, 2)}
    fixed1 = t[(1, 1)].peak_bytes - act1 - traced_states[1]
    fixed2 = t[(2, 1)].peak_bytes - act2 - traced_states[2]
    L = model.layers // layout.pp
    # Buffers grow with depth only through the optimizer's per-tensor temporaries: keep the 2-block figure.
    fixed = max(fixed1, fixed2) / layout.tp
    act = (act1 + (act2 - act1) * (L - 1)) * (TP_REPLICATED_ELEMENTWISE + (1 - TP_REPLICATED_ELEMENTWISE) / layout.tp)
    in_flight = min(layout.microbatches, layout.pp) if layout.pp > 1 else 1
    states = (L * unit + model.other_params) / layout.tp / layout.dp_shard * STATE_BYTES
    unsharded = 0.0 if layout.reshard or layout.dp_shard == 1 else max(L - 2, 0) * unit / layout.tp * model.param_bytes
    return states + fixed + unsharded + act * layout.microbatch_size * in_flight
