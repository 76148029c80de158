"""A model at another depth: the same family and widths with its first n blocks only, which mode=plan
traces (a model's cost and memory per block come from traces of a few blocks). A family whose spec
says how (`ModelSpec.with_blocks`, a config with n blocks) is built that way; any other is built whole
and its block list cut, which needs only that its forward runs the blocks its list holds."""

from __future__ import annotations

import contextlib
from contextvars import ContextVar

from torch import nn

_KEPT: ContextVar[int | None] = ContextVar("blocks_kept", default=None)


@contextlib.contextmanager
def blocks_kept(n: int | None):
    """Inside: models built by fsdp_lab.models.build_plain keep their first n blocks (None: all)."""
    token = _KEPT.set(n)
    try:
        yield
    finally:
        _KEPT.reset(token)


def cut_to_kept(model: nn.Module) -> nn.Module:
    """`model` with its block list cut to the blocks kept (as built, outside blocks_kept)."""
    n = _KEPT.get()
    blocks = getattr(model, "blocks", None) or []
    if n is None or len(blocks) <= n:
        return model
    first = blocks[0]
    for parent in model.modules():
        for name, child in parent.named_children():
            if isinstance(child, (nn.ModuleList, nn.Sequential)) and len(child) == len(blocks) and child[0] is first:
                setattr(parent, name, type(child)(list(child)[:n]))
                return model
    raise ValueError(f"the blocks of {type(model).__name__} are not one nn.ModuleList: cannot cut them to {n}")


def kept_blocks() -> int | None:
    return _KEPT.get()
