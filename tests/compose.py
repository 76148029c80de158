"""Composing conf/ in this process as the CLI does (Hydra, then `fsdp_lab.validate.prepare`), for
tests that need a config, a refusal or a mesh but no process. Tests reach these through the
`compose_run` and `prepared` fixtures (tests/conftest.py); module-level helpers import them here."""

from __future__ import annotations

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from fsdp_lab.config import RunConfig, to_run_config
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.run import CONF_DIR  # registers the schema and resolvers
from fsdp_lab.validate import prepare


def compose_cfg(*overrides: str) -> DictConfig:
    """conf/config.yaml with `overrides`, as `python -m fsdp_lab OVERRIDES` composes it."""
    GlobalHydra.instance().clear()  # a failed composition elsewhere may have left Hydra initialized
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def compose_run(*overrides: str) -> RunConfig:
    """The typed config, checked against the schema only (no cross-field checks)."""
    return to_run_config(compose_cfg(*overrides))


def prepared(*overrides: str) -> tuple[RunConfig, ParallelDims]:
    """The typed, checked run and its parallel dimensions; raises ConfigError as the CLI refuses."""
    return prepare(compose_cfg(*overrides))
