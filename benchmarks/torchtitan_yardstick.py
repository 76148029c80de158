"""The peer: torchtitan 0.2.0's llama3 model and its own `parallelize_llama` (TP, compile, FSDP/HSDP
as torchtitan applies them) on the lab's benchmark shape, driven by the same minimal loop as the
hand-written yardstick (random tokens, fused AdamW, bf16 params / fp32 reduction). Run with torchrun
with torchtitan importable (`pip install --no-deps torchtitan==0.2.0 torchdata==0.11.0 tyro
docstring-parser typeguard einops`); prints one JSON line (rank 0) like fsdp2_yardstick.py.

torchtitan's package imports its data loaders and TensorBoard writer at import time; a training loop
that feeds random tokens uses neither, so empty stand-ins take their place (torchtitan 0.2.0 needs
no newer torch than 2.11 for the parts this runs)."""

from __future__ import annotations

import contextlib
import sys
import types

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import loss_parallel
from yardstick_loop import init_process_group, parse_args, time_steps

from fsdp_lab.parallel.float8 import emulated

UNUSED_AT_IMPORT = ("torch.utils.tensorboard", "datasets", "datasets.distributed")


class StandIn(types.ModuleType):
    """An empty module whose every attribute is an empty class: enough for `from x import Y` and
    annotations in code this benchmark never calls."""

    __path__: list[str] = []

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {})


def import_torchtitan():
    for name in UNUSED_AT_IMPORT:
        sys.modules.setdefault(name, StandIn(name))
    from torchtitan.components.loss import build_cross_entropy_loss
    from torchtitan.config import JobConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.models.llama3 import Transformer, TransformerModelArgs, parallelize_llama
    from torchtitan.models.llama3.infra.parallelize import apply_fsdp
    return build_cross_entropy_loss, JobConfig, ParallelDims, Transformer, TransformerModelArgs, parallelize_llama, apply_fsdp


def main() -> None:
    a = parse_args(__doc__, ac=("none", "selective", "full"), float8=("none", "tensorwise", "rowwise"))
    device = init_process_group()
    build_loss, JobConfig, ParallelDims, Transformer, TransformerModelArgs, parallelize_llama, apply_fsdp = import_torchtitan()
    # torchtitan sizes SwiGLU as multiple_of * ceil((8 * dim / 3) / multiple_of): multiple_of = ffn_dim
    # gives ffn_dim exactly wherever 8 * dim / 3 <= ffn_dim < 16 * dim / 3 (both benchmark shapes).
    args = TransformerModelArgs(dim=a.dim, n_layers=a.n_layers, n_heads=a.n_heads, vocab_size=a.vocab_size,
                                multiple_of=a.ffn_dim, max_seq_len=a.seq_len, rope_theta=10000)
    job = JobConfig()
    job.training.seq_len, job.training.local_batch_size = a.seq_len, a.batch_size
    job.training.mixed_precision_param, job.training.mixed_precision_reduce = "bfloat16", "float32"
    job.compile.enable = a.compile
    # torchtitan's JobConfig defaults to selective activation checkpointing (every 2nd block): off, as
    # in the lab's benchmark and the hand-written loop, unless asked for.
    job.activation_checkpoint.mode = a.ac
    job.parallelism.data_parallel_replicate_degree = a.dp_replicate
    job.parallelism.tensor_parallel_degree = a.tp
    world = dist.get_world_size()
    dims = ParallelDims(dp_replicate=a.dp_replicate, dp_shard=-1, cp=1, tp=a.tp, pp=1, ep=1, etp=1, world_size=world)
    if device.type == "cpu":  # torchtitan names "cuda" when it finds no accelerator; the CPU try-out needs gloo's
        import torchtitan.distributed.parallel_dims as parallel_dims
        parallel_dims.device_type = "cpu"
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Transformer(args)
    hidden = model.layers["0"].feed_forward.w1.out_features
    if hidden != a.ffn_dim:
        sys.exit(f"torchtitan sized the MLP {hidden}, not --ffn-dim {a.ffn_dim}")
    converters = float8_converters(job, dims, a.float8, device) if a.float8 != "none" else None
    if converters is not None:
        converters.convert(model)  # before parallelize_llama, as torchtitan's trainer converts
    model = parallelize_llama(model, dims, job)
    if world == 1:
        # parallelize_llama shards only over more than one rank; on one GPU its own FSDP wrapping is
        # what gives the bf16 parameters and float32 reduction the lab's one-rank FSDP has.
        apply_fsdp(model, init_device_mesh(device.type, (1,)), param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                   pp_enabled=False, reshard_after_forward_policy=job.parallelism.fsdp_reshard_after_forward)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    if converters is not None:  # torchtitan's trainer calls it after every optimizer step (the scales' precompute)
        opt.register_step_post_hook(lambda *_: converters.post_optimizer_hook(model))
    # The loss is compiled with the model, as torchtitan's trainer does; with tp > 1 torchtitan keeps
    # the logits sharded by vocabulary and computes the loss and its backward on the shards.
    time_steps(model, opt, build_loss(job), a, device, loss_parallel if a.tp > 1 else contextlib.nullcontext)


def float8_converters(job, dims, recipe: str, device: torch.device):
    """torchtitan's float8 converter as its float8 configs set it: the output projection left in bf16;
    tensorwise is torchtitan's default float8 (no recipe name), its weights all-gathered in float8 with
    their scales precomputed; rowwise by recipe name (the lab's speed.py FLOAT8 sets the same).
    Written against torchtitan 0.2.0's JobConfig.quantize.linear.float8 and build_model_converters;
    another version without them stops here with the reason."""
    try:
        from torchtitan.protocols.model_converter import build_model_converters
        job.model.converters = ["quantize.linear.float8"]
        f = job.quantize.linear.float8
    except (ImportError, AttributeError) as e:
        sys.exit(f"--float8={recipe}: this torchtitan has no JobConfig.quantize.linear.float8 / build_model_converters as 0.2.0 has ({e})")
    f.filter_fqns = ["output"]
    # torchtitan takes tensorwise as "no recipe name" and refuses a recipe name with float8 all-gather.
    f.recipe_name = None if recipe == "tensorwise" else recipe
    f.enable_fsdp_float8_all_gather = f.precompute_float8_dynamic_scale_for_fsdp = recipe == "tensorwise"
    f.emulate = emulated(device)  # no float8 matmul (the CPU try-out): torchtitan's emulation, as the lab's
    return build_model_converters(job, dims)


if __name__ == "__main__":
    main()
