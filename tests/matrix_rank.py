"""Variant matrices on one set of ranks: torch elastic (torchrun's API, fsdp_lab.spawn.launch) forks
2 ranks once, from a warm process (tests/warm_lab.py), and they train every variant of a matrix
module (tests/ac_matrix.py, tests/ckpt_finetune_matrix.py, ...), each composed
from conf/ by Hydra and built by the lab's own `build_trainer`. Rank 0 writes {label: result} as
JSON; a variant that raises is recorded as {"error": its traceback}, so its test names it and the
other variants still run."""

from __future__ import annotations

import importlib
import json
import traceback
from collections.abc import Callable
from pathlib import Path

from fsdp_lab.dist import init_distributed
from warm_lab import in_a_warm_process


def _matrix_rank(matrix_module: str, out_path: str) -> None:
    importlib.import_module(matrix_module).main(out_path)


def _matrix_ranks(matrix_module: str, out_path: str, nproc: int) -> None:
    from fsdp_lab.spawn import launch as launch_ranks

    launch_ranks(_matrix_rank, (matrix_module, out_path), n=nproc, run_dir=Path(out_path).parent, max_restarts=0, start_method="fork")


def launch(matrix_module: str, out_dir: Path, timeout: float = 600, nproc: int = 2) -> dict:
    """`tests/<matrix_module>.py`'s main on `nproc` ranks; returns rank 0's {label: result}."""
    out = out_dir / "matrix.json"
    code, stdout, stderr = in_a_warm_process(_matrix_ranks, (matrix_module, str(out), nproc), timeout=timeout)
    assert code == 0, stdout[-1000:] + stderr[-3000:]
    return json.loads(out.read_text())


def result_of(matrix: dict, label: str) -> dict:
    """One variant's result; fails naming the variant's error when it raised."""
    result = matrix[label]
    assert "error" not in result, f"variant {label} raised:\n{result['error']}"
    return result


def run_matrix(variants: dict[str, list[str]], result: Callable[[list[str], object], dict], out_path: str) -> None:
    """`result(overrides, ctx)` for every variant, in order; rank 0 writes them to `out_path`."""
    ctx = init_distributed("cpu", timeout_s=120)
    results = {}
    for label, overrides in variants.items():
        try:
            results[label] = result(overrides, ctx)
        except Exception:
            results[label] = {"error": traceback.format_exc()}
    if ctx.is_main:
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)
