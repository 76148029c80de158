"""What must come of one configuration of the space: the pre-spawn check (Hydra composition, then
`fsdp_lab.validate.prepare`, as the CLI does) refuses it with one ConfigError line, or accepts it.

Hydra composes each choice of config groups once (what costs most); the other overrides go onto a
copy of it the way Hydra applies them after composing (ConfigLoaderImpl._apply_overrides_to_config)."""

from __future__ import annotations

import copy
import tempfile
from functools import lru_cache
from pathlib import Path

from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig

from config_space import GROUPS, command_line
from fsdp_lab.compose import compose_cfg
from fsdp_lab.config import ConfigError, RunConfig
from fsdp_lab.estimate import ESTIMATE_FILE, run_estimate
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.plan.run import PLAN_FILE, run_plan
from fsdp_lab.validate import prepare

GROUP_KEYS = {*GROUPS, "model", "logger", "debug"}


@lru_cache(maxsize=None)
def _composed_groups(groups: tuple[str, ...]) -> DictConfig:
    return compose_cfg(*groups)


def composed(args: list[str]) -> DictConfig:
    """conf/ composed with `args`, as `python -m fsdp_lab ARGS` composes it."""
    groups = tuple(a for a in args if a.split("=")[0] in GROUP_KEYS)
    cfg = copy.deepcopy(_composed_groups(groups))
    fields = [a for a in args if a not in groups]
    ConfigLoaderImpl._apply_overrides_to_config(OverridesParser.create().parse_overrides(fields), cfg)
    return cfg


def accepted_or_refused(args: list[str]) -> tuple[RunConfig, ParallelDims] | None:
    """The checked run and its dims, or None where it is refused as the CLI refuses (one line);
    anything else (a traceback, a message of several lines) fails with the command that reproduces it."""
    try:
        return prepare(composed(args))
    except ConfigError as e:
        message = str(e)
        assert message and "\n" not in message, f"{command_line(args)}\n  refused in more than one line: {message!r}"
        return None
    except Exception as e:
        raise AssertionError(f"{command_line(args)}\n  the check raised {type(e).__name__}: {e}") from e


def estimate_runs(args: list[str], run: RunConfig, dims: ParallelDims) -> None:
    """An accepted mode=estimate traces on the fake process group and writes its estimate."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            run_estimate(run, dims, Path(tmp))
        except Exception as e:
            raise AssertionError(f"{command_line(args)}\n  accepted, then mode=estimate raised {type(e).__name__}: {e}") from e
        assert (Path(tmp) / ESTIMATE_FILE).exists(), f"{command_line(args)}\n  accepted, but the estimate wrote nothing"


def plan_runs(args: list[str], run: RunConfig) -> None:
    """An accepted mode=plan ranks its candidates and writes plan.json."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            run_plan(run, Path(tmp), [a for a in args if a != "mode=plan"])
        except Exception as e:
            raise AssertionError(f"{command_line(args)}\n  accepted, then mode=plan raised {type(e).__name__}: {e}") from e
        assert (Path(tmp) / PLAN_FILE).exists(), f"{command_line(args)}\n  accepted, but the plan wrote nothing"
