"""fsdp.reduce_copy_in (parallel/grad_pack.py): FSDP2's reduce-scatter copy-in by the lab's Triton
kernel writes the bytes torch._chunk_cat writes, for any packing (ranks, uneven first dimensions,
1-D and 3-D gradients, bf16 into float32 or no cast), run in Triton's CPU interpreter in a process of
its own (the interpreter is chosen when a kernel is defined); a 1-rank FSDP2 run through the lab's
build trains bit for bit as with torch's copy-in while the kernel packs every unit, and so do 2 real
ranks under the CLI; the rest goes to torch's copy-in, and the key is set per run and refused off FSDP2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fsdp_lab.cli_process import lab_env, run_lab
from fsdp_lab.config import ConfigError
from fsdp_lab.parallel import grad_pack
from test_parallelize import TINY, loss_and_grad_norm

TESTS = Path(__file__).resolve().parent
CHECK = r"""
import sys
import torch
from fsdp_lab.parallel import grad_pack

for world in (1, 2, 3, 4, 8):
    for shapes in ([(8, 6), (5, 3), (7,), (1, 4)], [(13,), (2, 2, 3)], [(4096,), (96, 40)]):
        for source, reduce in ((torch.bfloat16, torch.float32), (torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16)):
            g = torch.Generator().manual_seed(world)
            grads = [(torch.randn(s, generator=g) * 1e3).to(source) for s in shapes]
            numel = sum(-(-s[0] // world) * world * (torch.Size(s).numel() // s[0]) for s in shapes)
            expected, out = torch.full((numel,), 7.0, dtype=reduce), torch.full((numel,), 7.0, dtype=reduce)
            torch._chunk_cat(grads, 0, world, out=expected.view(world, -1))
            assert grad_pack.takes(grads, out)
            grad_pack.pack_copy_in(grads, out, world)
            assert torch.equal(out, expected), (world, shapes, source, reduce)

# A 1-rank FSDP2 run through the lab's build: bf16 compute, float32 reduce, the kernel against chunk_cat.
sys.path.insert(0, sys.argv[1])
from test_parallelize import loss_and_grad_norm
from worlds import tiny_model_on_one_rank, world_of_one

packed = []
pack = grad_pack.pack
grad_pack.pack = lambda grads, out, world: packed.append(len(grads)) or pack(grads, out, world)
results = {}
for copy_in in ("torch", "kernel"):
    with world_of_one() as ctx:
        torch.manual_seed(0)
        results[copy_in] = loss_and_grad_norm(*tiny_model_on_one_rank(ctx, "fsdp.param_dtype=bfloat16", "fsdp.reduce_dtype=float32",
                                                                      f"fsdp.reduce_copy_in={copy_in}"))
    if copy_in == "torch":
        assert not packed
assert packed and results["kernel"] == results["torch"], (packed, results)
print(f"packed {len(packed)} units; {results}")
"""


@pytest.mark.slow
def test_the_kernel_writes_what_chunk_cat_writes_and_a_run_trains_bit_for_bit_as_with_it():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    result = subprocess.run([sys.executable, "-c", CHECK, str(TESTS)], env=env, capture_output=True, text=True, timeout=300, cwd=TESTS.parent)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "packed" in result.stdout


def test_what_the_kernel_does_not_take_goes_to_torchs_copy_in():
    """Outside the interpreter CPU tensors, and anywhere a narrowing cast (rounding is chunk_cat's to
    do), mixed dtypes or a strided gradient."""
    grads, out = [torch.ones(4, 2, dtype=torch.bfloat16)], torch.zeros(8)
    assert not grad_pack.takes(grads, out)  # CPU, not interpreted
    grad_pack.pack_copy_in(grads, out, 2)
    assert torch.equal(out, torch.ones(8))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(grad_pack, "_INTERPRETED", True)
        assert grad_pack.takes(grads, out)
        assert not grad_pack.takes([torch.ones(4, 2)], torch.zeros(8, dtype=torch.bfloat16))
        assert not grad_pack.takes([torch.ones(4, 2, dtype=torch.bfloat16), torch.ones(2)], torch.zeros(10))
        assert not grad_pack.takes([torch.ones(2, 4, dtype=torch.bfloat16).t()], out)
        assert not grad_pack.takes([torch.ones(0, 4, dtype=torch.bfloat16)], out)
        many = [torch.ones(1, dtype=torch.bfloat16)] * (grad_pack.MAX_SEGMENTS // 2 + 1)
        out = torch.zeros(2 * len(many))
        grad_pack.pack_copy_in(many, out, 2)  # more segments than a program reads: torch's, or the kernel would fail here
        assert torch.equal(out.view(2, -1), torch.tensor([[1.0] * len(many), [0.0] * len(many)]))


@pytest.mark.parametrize("copy_in", ["kernel", "torch"])
def test_each_run_sets_the_copy_in_fsdp2_reads_and_a_cpu_run_trains_as_with_torchs(on_one_rank, copy_in):
    def in_use() -> str:
        return "kernel" if grad_pack.fsdp_collectives.foreach_reduce_scatter_copy_in is grad_pack.pack_copy_in else "torch"

    expected = loss_and_grad_norm(*on_one_rank("fsdp.reduce_copy_in=torch"))
    assert in_use() == "torch"
    assert loss_and_grad_norm(*on_one_rank(f"fsdp.reduce_copy_in={copy_in}")) == expected
    assert in_use() == copy_in


def test_a_torch_without_the_copy_in_keeps_its_own_and_says_so(monkeypatch, caplog):
    monkeypatch.setattr(grad_pack, "_TORCH_COPY_IN", None)
    before = grad_pack.fsdp_collectives.foreach_reduce_scatter_copy_in
    with caplog.at_level("WARNING", logger="fsdp_lab.parallel.grad_pack"):
        grad_pack.use("kernel")
    assert grad_pack.fsdp_collectives.foreach_reduce_scatter_copy_in is before
    assert "has no foreach_reduce_scatter_copy_in to replace" in caplog.text


@pytest.mark.bad_input
def test_the_key_is_refused_off_fsdp2_and_outside_its_values(prepared):
    with pytest.raises(ConfigError, match=r"fsdp\.reduce_copy_in=torch.*fsdp2"):
        prepared(*TINY, "mesh=ddp", "fsdp.reduce_copy_in=torch")
    with pytest.raises(ConfigError, match=r"fsdp\.reduce_copy_in.*fast.*kernel.*torch"):
        prepared(*TINY, "fsdp.reduce_copy_in=fast")


def steps(run_dir: Path) -> list[tuple[float, float]]:
    return [(r["loss"], r["grad/norm"]) for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


@pytest.mark.slow
def test_real_ranks_train_bit_for_bit_with_the_kernels_copy_in_as_with_torchs(tmp_path):
    """In the interpreter each of 2 ranks' FSDP2 packs its gradients with the kernel (bf16 into a float32
    reduce, an embedding of 257 rows, split unevenly over the ranks): every step's loss and gradient
    norm are torch's copy-in's, and the run's parity against DDP holds. (HSDP packs for its shard group
    by the same call.)"""
    runs = {}
    for copy_in in ("torch", "kernel"):
        result = run_lab("debug=cpu_tiny", "mesh=fsdp", "model.vocab_size=257", "train.steps=3", "fsdp.param_dtype=bfloat16",
                         "fsdp.reduce_dtype=float32", f"fsdp.reduce_copy_in={copy_in}", run_dir=tmp_path / copy_in,
                         env=lab_env(TRITON_INTERPRET="1"))
        assert result.returncode == 0, result.stderr[-3000:]
        summary = json.loads((result.run_dir / "summary.json").read_text())
        assert summary["parity"]["ok"], summary["parity"]
        # Rank 0 logs (the others keep to warnings); every rank's packing feeds the reduce-scatters
        # whose shards the gradient norm sums.
        said = {log.parent.name for log in result.run_dir.glob("logs/*/attempt_0/*/*.log") if "by the lab's kernel" in log.read_text()}
        assert said == ({"0"} if copy_in == "kernel" else set())
        runs[copy_in] = steps(result.run_dir)
    assert len(runs["kernel"]) == 3 and runs["kernel"] == runs["torch"]
