"""A benchmark script (benchmarks/NAME.py) imported as a module, for tests of its functions, and the
profiler trace events those tests build traces from."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load(name: str) -> ModuleType:
    # As when the script runs: its own directory on the path, for the modules it shares with its siblings.
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def span(cat: str, name: str, ts: float, dur: float, tid: int = 1) -> dict:
    """A complete event of a torch.profiler chrome trace: a kernel, a copy, a host op or annotation
    (on host thread `tid`)."""
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid}
