"""Reading DCP checkpoints back: the full parameters a checkpoint holds, compared bit for bit."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save


def params(checkpoint: Path, tmp_path: Path) -> dict[str, torch.Tensor]:
    """The model's full parameters in a checkpoint, gathered from its shards."""
    out = tmp_path / f"{checkpoint.parent.parent.name}-{checkpoint.name}.pt"
    dcp_to_torch_save(checkpoint, out)
    return torch.load(out, weights_only=False)["model"]


def assert_bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
