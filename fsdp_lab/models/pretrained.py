"""model.pretrained=DIR: the weights of a local Hugging Face checkpoint (config.json + safetensors,
one file or shards with model.safetensors.index.json) loaded into the materialised model, each rank
reading only the slices its shards hold (safetensors' lazy `get_slice`, at the offsets the DTensor's
placements give), so no rank holds the whole model; the parity reference (whole on every rank)
reads the whole tensors. Parameters the checkpoint lacks are refused before any rank starts."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch
from torch import nn
from torch.distributed.fsdp._common_utils import clean_tensor_name
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from fsdp_lab.config import ConfigError

log = logging.getLogger("fsdp_lab")
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
# ForeignModel holds the transformers model as `inner`: its names gain this prefix.
PREFIX = "inner."


class Checkpoint:
    """A checkpoint directory's tensors by name, opened lazily (nothing is read until sliced)."""

    def __init__(self, directory: str):
        root = Path(directory)
        if (root / INDEX).exists():
            weight_map = json.loads((root / INDEX).read_text())["weight_map"]
            self.files = {key: root / file for key, file in weight_map.items()}
        elif (root / SINGLE).exists():
            from safetensors import safe_open

            with safe_open(root / SINGLE, framework="pt") as f:
                self.files = {key: root / SINGLE for key in f.keys()}
        else:
            raise ConfigError(f"model.pretrained={directory}: holds neither {INDEX} nor {SINGLE}")
        self._open: dict[Path, object] = {}

    def _handle(self, key: str):
        from safetensors import safe_open

        path = self.files[key]
        if path not in self._open:
            self._open[path] = safe_open(path, framework="pt")
        return self._open[path]

    def shape(self, key: str) -> list[int]:
        return list(self._handle(key).get_slice(key).get_shape())

    def read(self, key: str, offset: tuple[int, ...], shape: tuple[int, ...]) -> torch.Tensor:
        """The block of tensor `key` at `offset` of size `shape`, read from the file alone."""
        lazy = self._handle(key).get_slice(key)
        if not shape:
            return lazy[...]
        return lazy[tuple(slice(o, o + n) for o, n in zip(offset, shape))]


def checkpoint_key(name: str) -> str:
    """The checkpoint's name of the model's parameter `name` (wrappers' prefixes dropped)."""
    name = clean_tensor_name(name)
    return name[len(PREFIX):] if name.startswith(PREFIX) else name


def check_keys(model: nn.Module, directory: str) -> None:
    """Every parameter of `model` (on meta) is in the checkpoint with its shape; ConfigError if not."""
    ckpt = Checkpoint(directory)
    missing, wrong = [], []
    for name, p in model.named_parameters():
        key = checkpoint_key(name)
        if key not in ckpt.files:
            missing.append(key)
        elif ckpt.shape(key) != list(p.shape):
            wrong.append(f"{key} {ckpt.shape(key)} (the model's: {list(p.shape)})")
    if missing or wrong:
        what = (f"lacks {', '.join(missing[:3])}" + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")) if missing else ""
        what += ("; " if what else "") + (f"has other shapes: {', '.join(wrong[:3])}" if wrong else "")
        raise ConfigError(f"model.pretrained={directory}: the checkpoint {what} (is model.config the checkpoint's?)")


def _rss_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak_rss() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM (Linux)
    except OSError:
        pass


@torch.no_grad()
def load_local_shards(model: nn.Module, directory: str) -> dict:
    """Copy each parameter's local shard from the checkpoint; returns what was read and the host
    memory (resident set: before, and its peak during the load)."""
    started, before = time.perf_counter(), _rss_mib("VmRSS")
    _reset_peak_rss()
    ckpt = Checkpoint(directory)
    read_bytes = tensors = largest = 0
    for name, p in model.named_parameters():
        if isinstance(p, DTensor):
            shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
            local = p.to_local()
        else:
            shape, offset, local = tuple(p.shape), (0,) * p.dim(), p
        if not local.numel():
            continue
        block = ckpt.read(checkpoint_key(name), tuple(offset), tuple(shape))
        local.copy_(block.view(local.shape))
        nbytes = block.numel() * block.element_size()
        read_bytes, tensors, largest = read_bytes + nbytes, tensors + 1, max(largest, nbytes)
        del block
    # The resident set counts the checkpoint's pages this rank touched (file-backed, mapped by
    # safetensors, reclaimable) besides its anonymous memory: the slice in flight, at most `largest`.
    stats = {"read_mib": read_bytes / 2**20, "tensors": tensors, "largest_slice_mib": largest / 2**20, "rss_before_mib": before,
             "rss_peak_mib": _rss_mib("VmHWM"), "rss_file_mib": _rss_mib("RssFile"), "seconds": time.perf_counter() - started}
    log.info("model.pretrained=%s: read %.2f MiB in %d tensors (this rank's slices) in %.2f s; host RSS %.0f -> peak %.0f MiB",
             directory, stats["read_mib"], tensors, stats["seconds"], before, stats["rss_peak_mib"])
    return stats
