"""Peak memory per GPU of one layout, in closed form from the traces' estimated peaks: the plan's
pruning figure (a candidate shown as fitting gets mode=estimate's peak at its own config, search.py).

A trace's peak (the estimate's, FSDPMemTracker on the fake device) at 2 blocks and at the deeper
traces' depth grows by the same each block: at the model's depth, on that line (`at_depth`). That
peak at 1 and 2 samples splits into what does not grow with the batch and the activations per sample:
P(samples) = S + samples x A. A layout then swaps the trace's sharded states for its own (params,
gradients and Adam state, 16 bytes per parameter in fp32, over its shard group and tp), divides TP's share of the
activations and of the rest, holds every block's unsharded parameters when it does not reshard after
forward, and keeps a stage's share of the activations for up to pp microbatches in a pipeline."""

from __future__ import annotations

from fsdp_lab.plan.cost import TP_REPLICATED_ELEMENTWISE, Layout, Model
from fsdp_lab.plan.trace import TRACE_WORLD

# fp32 parameter, gradient, exp_avg and exp_avg_sq, sharded. The gradients count: the trace's world of
# 2 holds half the model's, which counted as fixed made a world of 4 hold two ranks' worth (the 8B full-AC
# row of the 4xH100 set priced 19.9% over its measured peak, the 1b and HF full-AC rows 15%; with them,
# within 1.3%).
STATE_BYTES = 16


def at_depth(shallow: float, deep: float, depths: tuple[int, int], layers: int) -> float:
    """A figure measured at two depths (blocks), on their line at `layers` blocks."""
    d1, d2 = depths
    return deep if d2 == d1 else deep + (layers - d2) * (deep - shallow) / (d2 - d1)


def peak_bytes(model: Model, layout: Layout) -> float:
    t, depths = model.traces, (2, model.depth)
    one, two = (at_depth(t[(2, s)].peak_bytes, t[(model.depth, s)].peak_bytes, depths, model.layers) for s in (1, 2))
    per_sample = max(two - one, 0.0)
    traced_states = (model.block_params + model.other_params) * STATE_BYTES / TRACE_WORLD
    fixed = max(one - per_sample - traced_states, 0.0)
    unit = model.block_params / model.layers
    L = model.layers // layout.pp
    act = per_sample * L / model.layers * (TP_REPLICATED_ELEMENTWISE + (1 - TP_REPLICATED_ELEMENTWISE) / layout.tp)
    in_flight = min(layout.microbatches, layout.pp) if layout.pp > 1 else 1
    states = (L * unit + model.other_params) / layout.tp / layout.dp_shard * STATE_BYTES
    unsharded = 0.0 if layout.reshard or layout.dp_shard == 1 else max(L - 2, 0) * unit / layout.tp * model.param_bytes
    # Grouped units gather g blocks at once, two groups in flight where the trace held two blocks.
    grouped = 0.0 if layout.dp_shard == 1 else 2 * (layout.wrap_group - 1) * unit / layout.tp * model.param_bytes
    return states + fixed / layout.tp + unsharded + grouped + act * layout.microbatch_size * in_flight
