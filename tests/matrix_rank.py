"""Variant matrices on one set of ranks: torchrun starts 2 ranks once (`launch`), and they train
every variant of a matrix module (tests/ac_matrix.py, tests/ckpt_finetune_matrix.py), each composed
from conf/ by Hydra and built by the lab's own `build_trainer`. Rank 0 writes {label: result} as
JSON; a variant that raises is recorded as {"error": its traceback}, so its test names it and the
other variants still run."""

from __future__ import annotations

import json
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from fsdp_lab.dist import init_distributed
from lab import REPO, lab_env


def launch(matrix_module: str, out_dir: Path, timeout: float = 600, nproc: int = 2) -> dict:
    """Run `tests/<matrix_module>.py` on `nproc` ranks; returns rank 0's {label: result}."""
    out = out_dir / "matrix.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           str(REPO / "tests" / f"{matrix_module}.py"), str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=lab_env())
    assert proc.returncode == 0, proc.stdout[-1000:] + proc.stderr[-3000:]
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
