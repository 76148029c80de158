"""torch.profiler's ranges (`record_function`) as no-ops while the estimate traces a step.

A range allocates nothing, and under op-level selective activation checkpointing it breaks the trace:
FSDP2 enters a range to cast a checkpointed block's inputs (`FSDP::cast_forward_inputs`) from its
pre-forward hook, which the traced forward enters outside the checkpointed region and the
recomputation inside it, and torch.utils.checkpoint refuses an op the forward did not record (`profiler._record_function_enter_new ... not found in storage`)."""

from __future__ import annotations

import contextlib

import torch.autograd.profiler as autograd_profiler
import torch.profiler


class _NoRange(contextlib.ContextDecorator):
    def __init__(self, name: str, args: str | None = None):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


@contextlib.contextmanager
def no_profiler_ranges():
    """Inside: `torch.profiler.record_function` (and torch.autograd.profiler's) record nothing."""
    original = autograd_profiler.record_function
    autograd_profiler.record_function = torch.profiler.record_function = _NoRange
    try:
        yield
    finally:
        autograd_profiler.record_function = torch.profiler.record_function = original
