"""fsdp.all_gather=in_place: FSDP2's all-gather with no copy-out. Each parameter is all-gathered straight
into its own unsharded storage, the unit's gathers issued as one coalesced collective, where FSDP2
gathers the unit into one packed buffer and then copies every parameter out of it
(torch.distributed.fsdp's _fsdp_collectives.foreach_all_gather_copy_out, `split_with_sizes_copy`).

Why: the copy-out runs on the compute stream, before each unit's forward (and backward, where the unit
was resharded), so its time is the step's: at the 8B shape on 4xH100, 13.0 ms a step in the profile of
docs/benchmarks.md ("Where the 8B step's time goes"), moving every gathered byte twice. A rank's shard of
a parameter sharded on dim 0 is rows [r*c, (r+1)*c) of it, so gathering the shards rank after rank into
the parameter's storage is the parameter, padding and all, in the layout FSDP2's copy-out writes.

What stays FSDP2's: the copy-in (the shards cast into the all-gather's inputs, on its copy-in stream),
the storage FSDP2 keeps per parameter (allocated here on the gathers' stream and freed by FSDP2 at reshard)
and everything after the gather (the unsharded parameters, float8's post-all-gather). Units it
does not take go to FSDP2's own all-gather and copy-out: a parameter sharded on another dim than 0, or
a custom all-gather (fsdp.symm_mem's, whose output must be symmetric memory). `use` chooses for the
process: FSDP2's unit reads both functions from its module at every unshard."""

from __future__ import annotations

import logging
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.distributed.fsdp._fully_shard._fsdp_collectives as fsdp_collectives
import torch.distributed.fsdp._fully_shard._fsdp_param_group as fsdp_param_group
from torch._subclasses.fake_tensor import FakeTensor

_TORCH_ALL_GATHER = fsdp_param_group.foreach_all_gather
_TORCH_COPY_OUT = fsdp_param_group.foreach_all_gather_copy_out
_said = False
log = logging.getLogger(__name__)


class GatheredInPlace(NamedTuple):
    """What FSDP2's unit keeps of an all-gather until its copy-out (it reads `all_gather_event` and
    `all_gather_work` by name). The inputs are held as FSDP2 holds its packed buffer: until the unit
    frees the result after the copy-out's event, so the copy-in stream cannot reuse them mid-gather."""
    all_gather_inputs: list[torch.Tensor]
    all_gather_event: torch.Event | None
    all_gather_work: dist.Work | None


def use(mode: str) -> None:
    """Every FSDP2 unit of this process all-gathers by `mode` (packed: FSDP2's; in_place) from now on."""
    in_place = mode == "in_place"
    fsdp_param_group.foreach_all_gather = all_gather_in_place if in_place else _TORCH_ALL_GATHER
    fsdp_param_group.foreach_all_gather_copy_out = copy_out if in_place else _TORCH_COPY_OUT


def takes(fsdp_params: list, all_gather_comm) -> bool:
    # Traced by compile (compiled autograd), FSDP2 recreates the outputs per gather: its own path.
    return (type(all_gather_comm) is fsdp_collectives.DefaultAllGather and not torch.compiler.is_compiling()
            and all(p.fsdp_placement.dim == 0 for p in fsdp_params))


@torch.no_grad()
def all_gather_in_place(fsdp_params, group, async_op, all_gather_copy_in_stream, all_gather_stream, device, all_gather_comm):
    """foreach_all_gather's contract, with each parameter's `all_gather_outputs` filled by the gather itself."""
    global _said
    if not takes(fsdp_params, all_gather_comm):
        return _TORCH_ALL_GATHER(fsdp_params, group, async_op, all_gather_copy_in_stream, all_gather_stream, device,
                                 all_gather_comm)
    world_size = group.size()
    device_handle = fsdp_collectives._get_device_handle(device.type)
    with device_handle.stream(all_gather_copy_in_stream):
        param_inputs = fsdp_collectives._get_param_all_gather_inputs(fsdp_params)
    compute_stream = device_handle.current_stream()
    all_gather_stream.wait_stream(all_gather_copy_in_stream)
    with device_handle.stream(all_gather_stream):
        # The storage comes from the gathers' stream, which writes it, and the compute stream, which reads
        # it until the unit reshards, is recorded on it: its memory is reused only once that stream is done
        # with it. Taken from the compute stream, the gathers would have to wait for all of its queued work,
        # and forward would gather no unit before the one ahead of it had run.
        for fsdp_param, inputs in zip(fsdp_params, param_inputs):
            fsdp_param.init_all_gather_outputs([t.numel() for t in inputs], [t.dtype for t in inputs], world_size, device)
            fsdp_param.alloc_all_gather_outputs()
            if device.type == "cuda":
                for output in fsdp_param.all_gather_outputs:
                    output.record_stream(compute_stream)
    inputs = [t for ts in param_inputs for t in ts]
    outputs = [t for p in fsdp_params for t in p.all_gather_outputs]
    # The gathers must not bump the outputs' version counters: with the unit resharded after forward,
    # backward gathers again into storage that autograd saved in forward (as FSDP2's copy-out keeps them).
    with device_handle.stream(all_gather_stream), torch.autograd._unsafe_preserve_version_counter(tuple(outputs)):
        work = _gather_each(outputs, inputs, group)
        if not async_op:
            work.wait()  # as a collective with async_op=False: the issuing stream waits for it
            work = None
        event = all_gather_stream.record_event()
    if not _said:  # once a process: the run's log says which all-gather its steps took
        _said = True
        log.info("fsdp2: each parameter all-gathered into its unsharded storage, no copy-out (fsdp.all_gather=in_place)")
    return GatheredInPlace(inputs, event, work)


def _gather_each(outputs: list[torch.Tensor], inputs: list[torch.Tensor], group) -> dist.Work:
    """One coalesced collective. Under fake tensors (the estimate's and the plan's traces), where c10d has
    no fake coalesced gather and FSDPMemTracker takes a gathered tensor's output for FSDP2's packed buffer
    (which it saw allocated), each gather in the list form: the same rows written, the storage counted
    as the unsharded parameters it is when FSDP2's pre-forward hands them to the tracker."""
    if not isinstance(outputs[0], FakeTensor):
        return group.allgather_into_tensor_coalesced(outputs, inputs)
    for out, inp in zip(outputs, inputs):
        work = dist.all_gather(list(out.view(group.size(), -1).unbind(0)), inp, group=group, async_op=True)
    return work


@torch.no_grad()
def copy_out(all_gather_result, fsdp_params, group) -> None:
    """foreach_all_gather_copy_out's contract: on return, the compute stream sees every gathered parameter."""
    if not isinstance(all_gather_result, GatheredInPlace):
        return _TORCH_COPY_OUT(all_gather_result, fsdp_params, group)
    if all_gather_result.all_gather_event is not None:
        device = fsdp_params[0].device
        fsdp_collectives._get_device_handle(device.type).current_stream().wait_event(all_gather_result.all_gather_event)
    if all_gather_result.all_gather_work is not None:
        all_gather_result.all_gather_work.wait()
