"""FSDP2's reduce-scatter copy-in at the 8B block: the block's unsharded bf16 gradients cast and packed
into the float32 reduce-scatter input (`reduce_dtype=float32`), rank-major, as
torch.distributed.fsdp's foreach_reduce does on the compute stream before every block's reduce-scatter
(`torch._chunk_cat`), beside other ways to write the same bytes and a plain copy of that many bytes
(the bandwidth bound), and the lab's kernel (`fsdp.reduce_copy_in=kernel`: parallel/grad_pack.py). Timed in bursts like the device table's kernels. Every way's output is checked
equal to chunk_cat's.

    python benchmarks/reduce_copy_in.py [--world 4]
"""

from __future__ import annotations

import argparse
import time

import torch

from fsdp_lab.calibrate.kernels import timed
from fsdp_lab.parallel.grad_pack import pack

# A Llama-3-8B block with full multi-head attention (the lab's 8b shape): its parameters' shapes.
BLOCK = [(4096, 4096)] * 4 + [(14336, 4096), (4096, 14336), (14336, 4096), (4096,), (4096,)]


def chunk_cat(grads, out, world):
    torch._chunk_cat(grads, 0, world, out=out.view(world, -1))


def copy_per_grad(grads, out, world):
    """Each gradient's rank-major rows copied (and cast) into its columns of the [world, -1] view."""
    rows, at = out.view(world, -1), 0
    for g in grads:
        width = g.numel() // world
        rows[:, at:at + width].copy_(g.reshape(world, width))
        at += width


def segments(grads, out, world):
    """Every gradient's rank-r chunk (contiguous) and the place it goes in rank r's row (contiguous)."""
    rows, at, sources, places = out.view(world, -1), 0, [], []
    for g in grads:
        width = g.numel() // world
        sources += list(g.reshape(world, width).unbind(0))
        places += list(rows[:, at:at + width].unbind(0))
        at += width
    return sources, places


def copy_per_segment(grads, out, world):
    for source, place in zip(*segments(grads, out, world)):
        place.copy_(source)


def foreach_copy_per_segment(grads, out, world):
    sources, places = segments(grads, out, world)
    torch._foreach_copy_(places, sources)


def chunk_cat_then_cast(grads, out, world):
    """Packed in the gradients' dtype, then cast in one contiguous copy."""
    packed = torch.empty(out.shape, dtype=grads[0].dtype, device=out.device)
    torch._chunk_cat(grads, 0, world, out=packed.view(world, -1))
    out.copy_(packed)


WAYS = {"chunk_cat (torch)": chunk_cat, "copy per gradient": copy_per_grad, "chunk_cat, then cast": chunk_cat_then_cast,
        "copy per segment": copy_per_segment, "foreach copy per segment": foreach_copy_per_segment,
        "copy per gradient, compiled": torch.compile(copy_per_grad), "the lab's kernel (grad_pack)": pack}


BUSY_CYCLES = 100_000_000  # a sleep kernel queued ahead of the call: ~50-70 ms at an H200's clocks


def host_ms(fn, device) -> float:
    """The host's milliseconds in one call issued behind a sleep kernel of BUSY_CYCLES: tens of
    milliseconds where the call waits for the GPU (a blocking copy of its metadata), a launch's time
    where it does not."""
    if device.type != "cuda":
        return float("nan")
    torch.cuda.synchronize()
    torch.cuda._sleep(BUSY_CYCLES)
    start = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=4)
    a = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    grads = [torch.randn(s, device=device, dtype=torch.bfloat16) for s in BLOCK]
    numel = sum(g.numel() for g in grads)
    moved = numel * (2 + 4)
    reference = torch.empty(numel, device=device, dtype=torch.float32)
    chunk_cat(grads, reference, a.world)
    src, dst = torch.empty(moved // 2, device=device, dtype=torch.uint8), torch.empty(moved // 2, device=device, dtype=torch.uint8)
    bound = timed(lambda: dst.copy_(src), 10, device)
    print(f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, torch {torch.__version__}: {numel / 1e6:.0f}M parameters a block, {a.world} ranks; "
          f"{moved / 1e9:.2f} GB moved (bf16 read, float32 written)")
    print(f"  {'a plain copy of as many bytes':28s} {bound * 1e3:7.3f} ms  {moved / bound / 1e12:5.2f} TB/s")
    for name, way in WAYS.items():
        out = torch.empty_like(reference)
        way(grads, out, a.world)
        assert torch.equal(out, reference), name
        s = timed(lambda: way(grads, out, a.world), 10, device)
        print(f"  {name:28s} {s * 1e3:7.3f} ms  {moved / s / 1e12:5.2f} TB/s  x32 blocks: {32 * s * 1e3:5.1f} ms a step  "
              f"host {host_ms(lambda: way(grads, out, a.world), device):6.2f} ms behind a queued sleep")


if __name__ == "__main__":
    main()
