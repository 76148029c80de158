"""Every known GPU's memory, GiB, for mode=estimate and mode=plan alike: a GPU with a device table
(fsdp_lab/plan/devices/<name>.json) by its table's spec, others by their memory alone. Apart from
fsdp_lab.plan because the estimate reads it and the plan imports the estimate."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

DEVICES_DIR = Path(__file__).resolve().parent / "plan" / "devices"
MEMORY_ONLY_GIB = {"h100-94gb": 93.6, "a100-40gb": 40.0, "a100-80gb": 80.0}


def tables() -> list[str]:
    """The devices with a timing table."""
    return sorted(p.stem for p in DEVICES_DIR.glob("*.json"))


@lru_cache(maxsize=None)
def memory_gib(name: str) -> float:
    """A known device's memory, GiB: its table's where it has one."""
    if name in tables():
        return json.loads((DEVICES_DIR / f"{name}.json").read_text())["spec"]["memory_gib"]
    return MEMORY_ONLY_GIB[name]
