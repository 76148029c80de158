"""What one transformer block keeps for backward, on this machine's device or as mode=estimate sees it:
the tensors autograd saves (shape, dtype, strides; storages counted once) and the attention kernel
that ran. Run it on a GPU and on the CPU (--estimate) to check the estimate's CUDA kernels
(fsdp_lab/estimate/cuda_kernels.py) against CUDA's.

    python benchmarks/saved_tensors.py                 # CUDA: the real kernels
    python benchmarks/saved_tensors.py --estimate      # CPU: fake tensors under the estimate's kernels"""

from __future__ import annotations

import argparse
import contextlib
import json

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from fsdp_lab.estimate.cuda_kernels import cuda_kernels
from fsdp_lab.models.transformer import RotaryTables, TransformerBlock

MIB = 2**20


def saved_by_block(dtype: torch.dtype, device: str, *, batch: int, seq: int, dim: int, heads: int, ffn: int) -> dict:
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in the dtype: fake parameters cannot be converted in place
    try:
        with torch.device(device):
            block = TransformerBlock(dim, heads, ffn, 1e-5)
    finally:
        torch.set_default_dtype(default)
    x = torch.randn(batch, seq, dim, device=device, dtype=dtype, requires_grad=True)
    cos, sin = RotaryTables(dim // heads).for_block(block, batch, seq, torch.device(device), dtype)
    saved, storages = [], {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        key = id(storage) if isinstance(t, FakeTensor) else storage.data_ptr()
        storages.setdefault(key, storage.nbytes())
        saved.append({"shape": list(t.shape), "dtype": str(t.dtype), "stride": list(t.stride()), "storage_mib": storage.nbytes() / MIB})
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = block(x, cos, sin)
    kernels = sorted(n for n in _all_grad_fns(out.grad_fn) if "Attention" in n or "Norm" in n)
    return {"dtype": str(dtype), "device": device, "saved_mib_unique_storages": sum(storages.values()) / MIB,
            "attention_and_norm_kernels": kernels, "saved": saved}


def _all_grad_fns(root) -> set[str]:
    seen, stack = {}, [root]  # seen keeps the nodes alive: an id is unique only while its object lives
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen[id(fn)] = fn
        stack.extend(f for f, _ in fn.next_functions)
    return {fn.name() for fn in seen.values()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--estimate", action="store_true", help="fake CPU tensors under the estimate's CUDA kernels")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--ffn", type=int, default=5632)
    args = parser.parse_args()
    shape = dict(batch=args.batch, seq=args.seq, dim=args.dim, heads=args.heads, ffn=args.ffn)
    with _estimate_mode() if args.estimate else contextlib.nullcontext():
        for dtype in (torch.float32, torch.bfloat16):
            print(json.dumps(saved_by_block(dtype, "cpu" if args.estimate else "cuda", **shape)), flush=True)


@contextlib.contextmanager
def _estimate_mode():
    with cuda_kernels(), FakeTensorMode():
        yield


if __name__ == "__main__":
    main()
