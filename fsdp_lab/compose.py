"""Composing a run from conf/ in this process, as `python -m fsdp_lab OVERRIDES` does: the schema
registered with Hydra, the conf dir, and overrides -> a typed RunConfig. The CLI, the planner, the
benchmarks and the tests all compose through here."""

from __future__ import annotations

from dataclasses import fields
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from fsdp_lab.config import ConfigError, ModelConfig, RunConfig, check_fields
from fsdp_lab.models import SPECS, model_spec
from fsdp_lab.rundir import register_resolvers
from fsdp_lab.search_space import register_search_resolvers

if TYPE_CHECKING:
    from fsdp_lab.mesh import ParallelDims

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")


def register_schema() -> None:
    """Make `run_schema` available to conf/config.yaml's defaults list, each model family's config
    as `/schema/model/NAME` to its conf/model/NAME.yaml, and the run dir's and the layout search's resolvers to Hydra."""
    store = ConfigStore.instance()
    store.store(name="run_schema", node=RunConfig)
    for name, spec in SPECS.items():
        store.store(group="schema/model", name=name, node=_model_schema(spec.config))
    register_resolvers()
    register_search_resolvers()


def _model_schema(config: type) -> DictConfig:
    """The family's structured config; its dict fields (a transformers config, a Hydra instantiate
    node) take new keys without `+`, as `model.config.hidden_size=256`."""
    node = OmegaConf.structured(config)
    for f in fields(config):
        if isinstance(getattr(config(), f.name), dict):
            OmegaConf.set_struct(node[f.name], False)
    return node


def to_run_config(cfg: DictConfig) -> RunConfig:
    """The composed DictConfig as a typed RunConfig, every interpolation resolved.

    Merging onto the schema again (the model's family config for `model`) catches keys that Hydra
    lets through with `+key=` overrides."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop("hydra", None)
    family = model_spec(plain.get("model", {}).get("name", ModelConfig.name)).config
    try:
        merged = OmegaConf.merge(_run_schema(family), plain)
    except Exception as e:  # omegaconf's errors span lines; the first names the key and value
        raise ConfigError(str(e).splitlines()[0]) from None
    run = OmegaConf.to_object(merged)
    check_fields(run)
    return run


@lru_cache(maxsize=None)
def _run_schema(family: type) -> DictConfig:
    """The run's schema with `family`'s config as its model, built once per family (the structured
    configs cost more than the merge; OmegaConf.merge copies it, never changing it)."""
    return OmegaConf.merge(OmegaConf.structured(RunConfig), {"model": _model_schema(family)})


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
    from fsdp_lab.validate import prepare  # validate types its input through this module

    return prepare(compose_cfg(*overrides))


register_schema()
