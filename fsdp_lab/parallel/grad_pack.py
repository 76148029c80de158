"""FSDP2's reduce-scatter copy-in in one Triton kernel: a unit's unsharded gradients cast to the reduce
dtype and packed rank-major into the reduce-scatter input, the bytes `torch._chunk_cat` writes there in
torch's foreach_reduce (torch.distributed.fsdp's _fsdp_collectives.foreach_reduce_scatter_copy_in).

Why: foreach_reduce runs the copy-in on the compute stream, before each unit's reduce-scatter, so its
time is the step's. At the 8B block on an H200, bf16 gradients into float32 at 4 ranks, chunk_cat
moves 1.46 GB in 0.72 ms (2.0 TB/s) where a plain copy of as many bytes takes 0.34 ms
(benchmarks/reduce_copy_in.py).

The kernel takes the casts that are exact (into the same dtype or a wider float: bf16 or float16 into
float32), of contiguous plain CUDA tensors in eager code; anything else goes to torch's copy-in, so the
bytes written are chunk_cat's either way. `fsdp.reduce_copy_in` chooses (fsdp2.py sets it for the
process: FSDP2 reads the function from its module at every reduce). In Triton's CPU interpreter
(TRITON_INTERPRET=1, where the tests run it) it takes CPU tensors too."""

from __future__ import annotations

import functools
import itertools
import logging
import os

import torch
import torch.distributed.fsdp._fully_shard._fsdp_collectives as fsdp_collectives

from fsdp_lab.models.kernels.launch import cdiv, jit, run, tl, triton

BLOCK = 4096  # elements per program
MAX_SEGMENTS = 1024  # every program reads all the segments' first tiles (a unit of 128 gradients over 8 ranks)
_TORCH_COPY_IN = getattr(fsdp_collectives, "foreach_reduce_scatter_copy_in", None)  # torch 2.11 and 2.13 have it
_EXACT = {(torch.bfloat16, torch.float32), (torch.float16, torch.float32)}
_TL = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32} if tl else {}
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
_said = False
log = logging.getLogger(__name__)


def use(copy_in: str) -> None:
    """Every FSDP2 unit of this process packs its gradients by `copy_in` (torch or kernel) from now on.
    A torch whose FSDP2 has no such function to replace keeps its own copy-in, and the log says so."""
    if _TORCH_COPY_IN is None:
        if copy_in == "kernel":
            log.warning("fsdp.reduce_copy_in=kernel: torch %s's FSDP2 has no foreach_reduce_scatter_copy_in to replace; "
                        "its own copy-in packs the gradients", torch.__version__)
        return
    fsdp_collectives.foreach_reduce_scatter_copy_in = pack_copy_in if copy_in == "kernel" else _TORCH_COPY_IN


def takes(grads: list[torch.Tensor], out: torch.Tensor) -> bool:
    dtype = grads[0].dtype
    where = "cpu" if _INTERPRETED else "cuda"
    return (triton is not None and not torch.compiler.is_compiling() and (dtype == out.dtype or (dtype, out.dtype) in _EXACT)
            and all(type(t) is torch.Tensor and t.device.type == where and t.is_contiguous() for t in (out, *grads))
            and all(g.dtype == dtype and g.dim() > 0 and g.numel() > 0 for g in grads))


def pack_copy_in(unsharded_grads: list[torch.Tensor], reduce_scatter_input: torch.Tensor, world_size: int) -> None:
    """foreach_reduce_scatter_copy_in's contract: `reduce_scatter_input` viewed as [world_size, -1]
    holds in row r every gradient's r-th dim-0 chunk (torch.chunk's, zero-padded to the largest)."""
    global _said
    if len(unsharded_grads) * world_size > MAX_SEGMENTS or not takes(unsharded_grads, reduce_scatter_input):
        return _TORCH_COPY_IN(unsharded_grads, reduce_scatter_input, world_size)
    pack(unsharded_grads, reduce_scatter_input, world_size)
    if not _said:  # once a process: the run's log says which copy-in its steps took
        _said = True
        log.info("fsdp2: gradients packed for the reduce-scatter by the lab's kernel (fsdp.reduce_copy_in=kernel), %s into %s",
                 unsharded_grads[0].dtype, reduce_scatter_input.dtype)


@functools.lru_cache(maxsize=256)
def layout(shapes: tuple[torch.Size, ...], element_size: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A unit's table but for its gradients' addresses, which change from step to step while the rest
    does not: rows (byte offset of the chunk in its gradient, source elements, destination offset,
    destination elements, first tile) by chunk, each chunk's gradient, and the tiles in all. Chunk r of a
    gradient with d0 rows of n elements is rows [r*c, (r+1)*c) (c = ceil(d0 / world_size), fewer or none
    at the end) and goes to row r of the [world_size, -1] input at the gradient's column, c*n wide (the
    rest zeros)."""
    widths = [cdiv(shape[0], world_size) * (shape.numel() // shape[0]) for shape in shapes]
    row_numel, rows, gradient_of_chunk, column = sum(widths), [], [], 0
    for i, (shape, width) in enumerate(zip(shapes, widths)):
        for r in range(world_size):
            taken = max(0, min(width, shape.numel() - r * width))
            rows.append((r * width * element_size, taken, r * row_numel + column, width))
            gradient_of_chunk.append(i)
        column += width
    tiles = [cdiv(width, BLOCK) for *_, width in rows]
    first_tiles = [0, *itertools.accumulate(tiles)][:-1]
    table = torch.tensor([list(row) for row in zip(*rows)] + [first_tiles], dtype=torch.int64)
    return table, torch.tensor(gradient_of_chunk), sum(tiles)


def pack(grads: list[torch.Tensor], out: torch.Tensor, world_size: int) -> None:
    static, gradient_of_chunk, tiles = layout(tuple(g.shape for g in grads), grads[0].element_size(), world_size)
    table = torch.empty(static.shape, dtype=torch.int64, pin_memory=out.is_cuda)
    table.copy_(static)
    table[0] += torch.tensor([g.data_ptr() for g in grads]).index_select(0, gradient_of_chunk)  # each chunk's address
    run(_pack_kernel, (tiles,), table.to(out.device, non_blocking=True), static.shape[1], out, SOURCE=_TL[grads[0].dtype],
        SEGMENTS=triton.next_power_of_2(static.shape[1]), BLOCK=BLOCK)


@jit
def _pack_kernel(table, segments, out_ptr, SOURCE: tl.constexpr, SEGMENTS: tl.constexpr, BLOCK: tl.constexpr):
    tile = tl.program_id(0).to(tl.int64)
    index = tl.arange(0, SEGMENTS)
    first_tiles = tl.load(table + 4 * segments + index, mask=index < segments, other=2**62)
    segment = tl.sum((first_tiles <= tile).to(tl.int32), axis=0) - 1  # the last segment starting at or before this tile
    source = tl.load(table + segment).to(tl.pointer_type(SOURCE))
    at = (tile - tl.load(table + 4 * segments + segment)) * BLOCK + tl.arange(0, BLOCK)
    values = tl.load(source + at, mask=at < tl.load(table + segments + segment), other=0)
    place = out_ptr + tl.load(table + 2 * segments + segment) + at
    tl.store(place, values.to(out_ptr.dtype.element_ty), mask=at < tl.load(table + 3 * segments + segment))
