"""Small facts about modules that the parallelizing code, the trainer, the probes and the estimate
all need; kept out of any one of them so none has to import another for it."""

from __future__ import annotations

from torch import nn


def unwrap(module: nn.Module) -> nn.Module:
    """The user's module inside a DDP or FSDP1 wrapper (FSDP2 modifies the module in place)."""
    return getattr(module, "module", module)
