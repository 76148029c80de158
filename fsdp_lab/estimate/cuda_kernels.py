"""Kernels whose saved tensors differ between the estimate's fake CPU device and CUDA, replaced (under
the estimate only) by functions that allocate what the CUDA kernel allocates and save what it saves.

Under FakeTensorMode no values exist, so a replacement only creates tensors of the right shapes,
dtypes and layouts, in the order the CUDA kernel creates and frees them:

- `nn.RMSNorm`: CUDA runs the fused kernel (`_fused_rms_norm`), which saves the input and the fp32
  `rstd` per row; the CPU composite also keeps the fp32 upcast and the normalised input.
- `F.scaled_dot_product_attention`: on Hopper (torch 2.11, checked on an H200 with
  benchmarks/saved_tensors.py) bf16/fp16 runs cuDNN attention, whose output follows the query's
  layout: a contiguous (batch, heads, seq, dim) query gives a contiguous output, so the
  `transpose(1, 2).reshape` before the output projection copies it and the projection saves the
  copy beside it; the lab's transformer rotates q and k laid out (batch, seq, heads, dim) and
  transposes them after, so its output keeps that layout and the reshape is a view. fp32 (or a mask, or a head size cuDNN does not take)
  runs the memory-efficient kernel, which lays its output out (batch, seq, heads, dim): there the
  reshape is a view. Both save q, k, v, the output and an fp32 logsumexp per row. The replacement
  calls the op CUDA would run; their fake (meta) implementations allocate as CUDA does, and
  mode=plan records them as attention.
- The lab's Triton kernels for the transformer's rotary and SwiGLU (models/kernels/): eager blocks on a
  GPU take them, so the trace does (kernels.launch.as_on_a_gpu), with their outputs and saved tensors.
- Adam's step: a GPU run fuses it (one kernel updating every tensor in place, nothing allocated);
  the fake CPU device takes the single-tensor path, which adds parameter-sized temporaries, and over
  fake DTensors on torch 2.11 gathers whole tensors. The replacement updates each parameter's local
  shard in place. (An explicit `optim.foreach=true` runs the multi-tensor path, as on the GPU.)

Inputs that are DTensors (e.g. a sequence-parallel norm) run on their local shards."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
import torch.optim.adam as adam_module  # torch.optim hides the submodule's name
from torch import nn
from torch.distributed.tensor import DTensor, Partial

from fsdp_lab.models.kernels.launch import as_on_a_gpu

SUBSTITUTED = {
    "nn.RMSNorm": "CUDA fused RMSNorm: saves the input and fp32 rstd per row",
    "F.scaled_dot_product_attention": "CUDA cuDNN attention for bf16/fp16 (output in the query's layout), else the "
                                      "memory-efficient kernel (output laid out (batch, seq, heads, dim)); both save "
                                      "q, k, v, output, logsumexp",
    "Adam/AdamW step": "CUDA fused Adam: every tensor updated in place, nothing allocated",
    "rotary, SwiGLU": "the lab's Triton kernels (models/kernels/): rotary tables per sequence, SwiGLU keeps gate and up only",
}


class _FusedRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor | None):
        rstd = x.new_empty((*x.shape[:-1], 1), dtype=torch.float32)
        ctx.save_for_backward(x, rstd, weight)
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, rstd, weight = ctx.saved_tensors
        grad_weight = None if weight is None else torch.empty_like(weight)
        return torch.empty_like(x, memory_format=torch.contiguous_format), grad_weight


def _rms_norm(self: nn.RMSNorm, x: torch.Tensor) -> torch.Tensor:
    weight = self.weight
    if isinstance(weight, DTensor):  # each rank's weight gradient is a partial sum, as DTensor's own rule gives
        weight = weight.to_local(grad_placements=[Partial()] * weight.device_mesh.ndim)
    if isinstance(x, DTensor):
        out = _FusedRMSNorm.apply(x.to_local(), weight)
        return DTensor.from_local(out, x.device_mesh, x.placements, run_check=False)
    return _FusedRMSNorm.apply(x, weight)


def _sdpa(original):
    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        plain = not any(isinstance(t, DTensor) for t in (query, key, value, attn_mask))
        if not plain or enable_gqa or query.dim() != 4 or query.shape[1] != key.shape[1]:
            return original(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        if _takes_cudnn(query, attn_mask, dropout_p):
            return torch.ops.aten._scaled_dot_product_cudnn_attention(
                query, key, value, None, True, dropout_p, is_causal, False, scale=scale,
            )[0]
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, attn_mask, True, dropout_p, is_causal, scale=scale,
        )[0]
    return sdpa


def _takes_cudnn(query: torch.Tensor, attn_mask, dropout_p: float) -> bool:
    """Whether CUDA's dispatcher picks cuDNN attention on Hopper: half precision, no mask, no
    dropout, a head size that is a multiple of 8 up to 128."""
    head = query.shape[-1]
    return (query.dtype in (torch.bfloat16, torch.float16) and attn_mask is None and not dropout_p
            and head % 8 == 0 and head <= 128)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _fused_adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *args, amsgrad: bool,
                beta1, beta2, lr, weight_decay: float, **kwargs) -> None:
    """The memory of CUDA's fused Adam: in-place updates of the local shards (under fake tensors only
    shapes exist, so the update is the right sequence of in-place ops, not the bias-corrected values)."""
    for i, param in enumerate(params):
        p, grad, m, v = (_local(t) for t in (param, grads[i], exp_avgs[i], exp_avg_sqs[i]))
        state_steps[i].add_(1)
        if weight_decay:
            p.mul_(1 - lr * weight_decay)
        m.lerp_(grad, 1 - beta1)
        v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        if amsgrad:
            v = torch.maximum(_local(max_exp_avg_sqs[i]), v, out=_local(max_exp_avg_sqs[i]))
        p.addcdiv_(m, v, value=-lr)


@contextlib.contextmanager
def cuda_kernels():
    """Inside: nn.RMSNorm, F.scaled_dot_product_attention, Adam's default step and the lab's Triton
    kernels allocate and save as on a GPU."""
    rms_forward, sdpa, adam = nn.RMSNorm.forward, F.scaled_dot_product_attention, adam_module._single_tensor_adam
    nn.RMSNorm.forward = _rms_norm
    F.scaled_dot_product_attention = _sdpa(sdpa)
    adam_module._single_tensor_adam = _fused_adam
    try:
        with as_on_a_gpu():
            yield
    finally:
        nn.RMSNorm.forward, F.scaled_dot_product_attention, adam_module._single_tensor_adam = rms_forward, sdpa, adam
