"""A Llama-style decoder: RMSNorm, rotary attention with scaled_dot_product_attention, SwiGLU MLP,
optional tied embeddings. Sizes go from tiny (tests) to ~1B (benchmarks).

Heads are reshaped with -1 so tensor parallelism, which leaves each rank a slice of the heads,
needs no change here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from fsdp_lab.config import ModelConfig, bounded
from fsdp_lab.models.blocks import call_block, repeated_block_params
from fsdp_lab.models.kernels import rotary, swiglu
from fsdp_lab.models.joint_linear import joint_linear


@dataclass
class TransformerConfig(ModelConfig):
    name: str = "transformer"
    dim: int = bounded(64, ge=1)
    """Model width (embedding and residual stream)."""
    n_layers: int = bounded(2, ge=1)
    """Transformer blocks."""
    n_heads: int = bounded(4, ge=1)
    """Attention heads; must divide dim."""
    ffn_dim: int = bounded(128, ge=1)
    """Hidden size of each block's SwiGLU MLP."""
    vocab_size: int = bounded(256, ge=2)
    """Token vocabulary."""
    tie_embeddings: bool = False
    """Share the token embedding with the output projection."""
    norm_eps: float = bounded(1e-5, gt=0)
    """RMSNorm epsilon."""
    layer_order: Optional[list[int]] = None
    """The blocks' call order in forward, repeats allowed: [0, 0, 1] runs block 0 twice (a module used
    several times in one forward); null = each block once, in order."""
    kernels: bool = True
    """Eager blocks on a GPU run the rotary and SwiGLU in the lab's Triton kernels (fsdp_lab/models/kernels/);
    false: PyTorch's elementwise ops everywhere (SwiGLU's gate gradient then rounds exactly as theirs)."""


class RotaryTables:
    """The rotary cos/sin tables per (batch, seq_len, heads, device, dtype), computed on first use:
    once per run, not per step, and already in the activations' dtype, so no block casts them.

    Laid out as the activations they rotate, (batch, seq, heads, head_dim), each frequency's value
    repeated for its (even, odd) pair and sin negated on the even lanes. Every operand of the
    rotation's products is then contiguous, so the GPU's elementwise kernels vectorize; tables of
    shape (seq, 1, head_dim) broadcast instead, and the rotary's forward and backward took 0.378 ms
    per call against 0.268 ms at the speed benchmark's shape (benchmarks/rotary_forms.py, one H200).
    `heads`: as many as one rotary call rotates (`Attention.rotated_heads`), so that the tables match
    the activations exactly: q's and k's heads together, or under tensor parallelism a rank's share.

    `broadcast`: keep them (1, seq, 1, head_dim) instead, for compiled blocks: inductor fuses the
    rotation into its neighbours' kernels, so full tables would only add memory (64 MiB each for q's
    and k's 32 heads at that shape) and reads. Eager blocks whose rotation the Triton kernel takes
    (models/kernels/rotary.py) read them so too, unless `kernels` is false."""

    def __init__(self, head_dim: int, base: float = 10000.0, broadcast: bool = False, kernels: bool = True):
        self.head_dim, self.base, self.broadcast, self.kernels = head_dim, base, broadcast, kernels
        self._tables: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, batch: int, seq_len: int, heads: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        broadcast = self.broadcast or (self.kernels and rotary.broadcast_tables(device, dtype))
        shape = (1, seq_len, 1, self.head_dim) if broadcast else (batch, seq_len, heads, self.head_dim)
        key = (shape, device, dtype)
        if key not in self._tables:
            inv_freq = 1.0 / (self.base ** (torch.arange(0, self.head_dim, 2, device=device, dtype=torch.float32) / self.head_dim))
            angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
            cos = angles.cos().repeat_interleave(2, dim=-1)
            sin = torch.stack((-angles.sin(), angles.sin()), dim=-1).flatten(-2)
            self._tables[key] = tuple(t[:, None].to(dtype).expand(shape).contiguous() for t in (cos, sin))
        return self._tables[key]

    def for_block(self, block: nn.Module, batch: int, seq_len: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The tables a TransformerBlock rotates with: as many heads as its attention rotates at once."""
        return self(batch, seq_len, block.attention.rotated_heads, device, dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kernels: bool = True) -> torch.Tensor:
    """Rotate each (even, odd) pair of x's last dimension, x: (batch, seq, heads, head_dim):
    (x1 cos - x2 sin, x1 sin + x2 cos), in one Triton kernel where it runs (models/kernels/rotary.py)
    and `kernels` allows it, else in PyTorch's ops; the same numbers either way."""
    if kernels and rotary.takes_rotation(x, cos, sin):
        return rotary.rotate(x, cos, sin)
    return rotate_pairs(x, cos, sin)


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotation in PyTorch's ops: the same products and sums in x's dtype as the pairwise form,
    in 4 elementwise kernels instead of 7."""
    if cos.dtype != x.dtype:
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)  # (x2, x1) in each pair
    return x * cos + swapped * sin


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int, kernels: bool = True):
        super().__init__()
        self.n_heads, self.head_dim, self.kernels = n_heads, dim // n_heads, kernels
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    @property
    def projects_jointly(self) -> bool:
        """Whether forward projects q and k in one matmul from their weights, which bypasses the two
        modules' own calls: only where they are plain linears that nothing hooks. Tensor parallelism
        (hooks that shard the input and output), an FSDP unit of its own (hooks, or a wrapper, that
        gather the weight) and a probe's forward hook each need the module called."""
        return all(type(w) is nn.Linear and not (w._forward_hooks or w._forward_pre_hooks) for w in (self.wq, self.wk))

    @property
    def rotated_heads(self) -> int:
        """Heads one rotary call rotates: q's and k's together, or, each projection called on its
        own, q's heads (under tensor parallelism a rank's share)."""
        if self.projects_jointly:
            return 2 * self.n_heads
        w = self.wq.weight
        tp = w.device_mesh["tp"].size() if isinstance(w, DTensor) and "tp" in (w.device_mesh.mesh_dim_names or ()) else 1
        return self.n_heads // tp

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        bsz, seq, _ = x.shape
        heads = lambda t: t.view(bsz, seq, -1, self.head_dim)  # noqa: E731
        # Rotated before the heads move in front of the sequence: contiguous rows, no strided lanes.
        # Compiled blocks project apart too: inductor fuses the rotation anyway, and its partitioner
        # keeps the joint weight from forward for backward instead of concatenating it again (+16 MiB
        # a block at the speed benchmark's shape); their rotary tables broadcast over the heads.
        if not self.projects_jointly or torch.compiler.is_compiling():
            q, k = (apply_rotary(heads(w(x)), cos, sin, self.kernels) for w in (self.wq, self.wk))
        else:
            # q and k in one matmul into one buffer, rotated together: half the rotary's kernels, and
            # backward takes x's gradient in one matmul instead of two and a sum.
            qk = heads(joint_linear(x, self.wq.weight, self.wk.weight))
            q, k = apply_rotary(qk, cos, sin, self.kernels).chunk(2, dim=2)
        v = heads(self.wv(x))
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(bsz, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, kernels: bool = True):
        super().__init__()
        self.kernels = kernels
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w1(x), self.w3(x)
        if self.kernels and swiglu.takes_swiglu(gate, up):  # one Triton kernel each way (models/kernels/swiglu.py)
            return self.w2(swiglu.swiglu(gate, up))
        return self.w2(F.silu(gate) * up)


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, n_heads: int, ffn_dim: int, norm_eps: float, kernels: bool = True):
        super().__init__()
        self.attention_norm = nn.RMSNorm(dim, eps=norm_eps)
        self.attention = Attention(dim, n_heads, kernels)
        self.ffn_norm = nn.RMSNorm(dim, eps=norm_eps)
        self.feed_forward = FeedForward(dim, ffn_dim, kernels)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.dim // cfg.n_heads
        self.rotary = RotaryTables(self.head_dim, broadcast=cfg.compile, kernels=cfg.kernels)
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(
            TransformerBlock(cfg.dim, cfg.n_heads, cfg.ffn_dim, cfg.norm_eps, cfg.kernels) for _ in range(cfg.n_layers)
        )
        self.layer_order = list(cfg.layer_order or range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    @property
    def blocks(self) -> list[nn.Module]:
        return list(self.layers)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        cos, sin = self.rotary.for_block(self.layers[0], *tokens.shape, h.device, h.dtype)
        for i in self.layer_order:
            h = call_block(self, i, self.layers[i], h, cos, sin)
        return self.output(self.norm(h))

    def synthetic_batch(self, generator: torch.Generator, batch_size: int, seq_len: int):
        vocab = self.tok_embeddings.num_embeddings
        tokens = torch.randint(0, vocab, (batch_size, seq_len + 1), generator=generator)
        return tokens[:, :-1], tokens[:, 1:]

    def tokens_per_sample(self, seq_len: int) -> int:
        return seq_len

    def flops_per_token(self, seq_len: int) -> float:
        # 6N for the matmuls of forward + backward (embedding lookups excluded), plus attention's
        # scores and weighted sum: 12 * block calls * dim * seq (PaLM appendix B).
        n = sum(p.numel() for p in self.parameters()) - self.tok_embeddings.weight.numel() + repeated_block_params(self)
        if self.output.weight is self.tok_embeddings.weight:
            n += self.output.weight.numel()
        dim = self.head_dim * self.n_heads
        return 6.0 * n + 12.0 * len(self.layer_order) * dim * seq_len
