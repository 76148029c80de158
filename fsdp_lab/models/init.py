"""Built shard by shard: a model is built with its parameters on the meta device (no memory), sharded
(TP, FSDP), and only then materialised, one module at a time: each module's parameters are
initialised whole on the device from a seed derived from the run's seed and the module's name, and
this rank keeps its shard of them. The values therefore depend on neither the mesh, the engine, the
wrapping nor the order modules are visited in: the parity reference, built unsharded the same way,
starts from the same weights, and so does every other mesh.

Buffers are built real (they are small and often computed in __init__, e.g. rotary frequencies)."""

from __future__ import annotations

import contextlib
import weakref
import zlib
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor


@contextlib.contextmanager
def meta_parameters() -> Iterator[None]:
    """Parameters registered inside go to the meta device; buffers and other tensors stay real."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and not param.is_meta:
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


# A module swapped in for another after the Materializer learnt the names (float8's Float8Linear for
# an nn.Linear) -> the one it replaced: it is initialised under that one's name, from its seed.
_REPLACED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def takes_place_of(new: nn.Module, old: nn.Module) -> None:
    _REPLACED[new] = old


class Materializer:
    """Remembers the model's module names before wrapping renames them (checkpoint wrappers, FSDP1,
    DDP), then materialises the model or any wrapped form of it."""

    def __init__(self, model: nn.Module, seed: int, init_module: Callable[[nn.Module, nn.Module], None]):
        self.model, self.seed, self.init_module = model, seed, init_module
        self.names = {id(m): name for name, m in model.named_modules(remove_duplicate=False)}

    def module_seed(self, name: str) -> int:
        return (self.seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63

    @torch.no_grad()
    def materialise(self, model: nn.Module, device: torch.device, *, param_device: torch.device | None = None) -> None:
        """Allocate `model`'s (possibly sharded) parameters on `param_device` (default `device`) and
        initialise them on `device`."""
        buffers = {(id(m), n): b for m in model.modules() for n, b in m.named_buffers(recurse=False) if b is not None}
        swap = torch.__future__.get_swap_module_params_on_conversion()
        torch.__future__.set_swap_module_params_on_conversion(True)  # keeps each parameter object: ties hold
        try:
            model.to_empty(device=param_device or device)
        finally:
            torch.__future__.set_swap_module_params_on_conversion(swap)
        for m in model.modules():
            for n in list(m._buffers):
                if (id(m), n) in buffers:
                    m._buffers[n] = buffers[id(m), n].to(device)
        # A shared (tied) parameter is initialised by the first module holding it (sharding keeps
        # one parameter object for all of them; to_empty swapped tensors into the same objects).
        owner: dict[int, nn.Module] = {}
        for module in model.modules():
            for p in module.parameters(recurse=False):
                owner.setdefault(id(p), module)
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):  # the run's RNG stays as it was
            for module in model.modules():
                name = self.names.get(id(_REPLACED.get(module, module)))
                own = list(module.named_parameters(recurse=False))
                if name is None or not own:
                    continue
                torch.manual_seed(self.module_seed(name))
                self._init(module, own, device, owner)

    def _init(self, module: nn.Module, own: list, device: torch.device, owner: dict) -> None:
        """Swap whole-size tensors in for the module's parameters, initialise, copy each rank's shard back."""
        whole = {}
        for n, p in own:  # a DTensor's shape is the global one
            whole[n] = nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=device), requires_grad=p.requires_grad)
            module._parameters[n] = whole[n]
        try:
            self.init_module(self.model, module)
        finally:
            for n, p in own:
                module._parameters[n] = p
        for n, p in own:
            if owner[id(p)] is not module:
                continue
            full = whole[n].data
            if isinstance(p, DTensor):
                local = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local()
                p.to_local().copy_(local)
            else:
                p.copy_(full)
