"""layout=auto's choices, kept between runs. The plan behind a choice takes seconds to minutes and gives
the same answer for the same inputs (on 4xH100, 2026-11-27, the 8B float8 runs under layout=auto took
123-137 s from start to finish, bf16's 74-86 s, torchtitan's 40-58 s), so a run repeated as it was (a
benchmark's repeated runs, a requeued job, the same command again) takes the choice made before.

The key holds everything the choice depends on: the run's config, the device table, the GPUs, the keys
the command line pinned, the lab's own source and device tables, torch's release (and torchao's with
float8), and what the model's family says lies outside its config (ModelSpec.outside_config: for
model=hf the transformers config as read and the transformers release). A model whose code the lab
cannot see (model=custom) always plans. plan.cache=false plans afresh. The files are under
$FSDP_LAB_CACHE (default ~/.cache/fsdp_lab), one small JSON file a choice."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from functools import lru_cache
from pathlib import Path

import torch

from fsdp_lab.config import RunConfig

log = logging.getLogger(__name__)
PACKAGE = Path(__file__).resolve().parent


def cache_dir() -> Path:
    return Path(os.environ.get("FSDP_LAB_CACHE") or Path.home() / ".cache" / "fsdp_lab") / "layout_auto"


@lru_cache(maxsize=1)
def _source_digest() -> str:
    """The lab's own source and device tables: a changed cost model or table plans again."""
    digest = hashlib.sha256()
    for path in sorted(p for p in PACKAGE.rglob("*") if p.suffix in (".py", ".json") and p.is_file()):
        digest.update(str(path.relative_to(PACKAGE)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _releases(run: RunConfig) -> list[str]:
    releases = [f"torch {torch.__version__}"]
    if run.float8.recipe != "none":
        from importlib.metadata import PackageNotFoundError, version

        try:
            releases.append(f"torchao {version('torchao')}")
        except PackageNotFoundError:  # the run's checks refuse float8 without torchao in one line, after the choice
            releases.append("no torchao")
    return releases


def choice_key(run: RunConfig, table: str, gpus: int, pinned: dict[str, str]) -> str | None:
    """The name a choice for these inputs is kept under; None where it is not kept (plan.cache=false,
    or a model whose code the lab cannot see)."""
    from fsdp_lab.models import model_spec

    outside = model_spec(run.model.name).outside_config(run.model)
    if outside is None or not run.plan.cache:
        return None
    inputs = [repr(run), table, gpus, sorted(pinned.items()), _source_digest(), outside, _releases(run)]
    return hashlib.sha256(json.dumps(inputs).encode()).hexdigest()


def kept_choice(key: str) -> dict | None:
    """The choice kept under `key`, or None (none kept, or a file that does not read: the plan runs)."""
    try:
        return json.loads((cache_dir() / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None


def keep_choice(key: str, chosen: dict) -> None:
    """Write the choice atomically (runs of a sweep, or torchrun's ranks, may write the same one at once).
    A cache that cannot be written costs the next run a plan, not this run: it says so and goes on."""
    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        partial = directory / f"{key}.{os.getpid()}.partial"
        partial.write_text(json.dumps(chosen))
        os.replace(partial, directory / f"{key}.json")
    except OSError as e:
        log.warning("layout=auto: the choice is not kept for the next run (%s)", e)
