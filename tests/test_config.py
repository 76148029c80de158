"""Composition of every config group option and experiment, and one-line rejection of bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from fsdp_lab.config import ConfigError, to_run_config
from fsdp_lab.run import CONF_DIR  # registers the schema and resolvers
from lab import run_lab

GROUPS = ["model", "mesh", "wrap", "ac", "checkpoint", "optim", "probes", "logger"]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml"))


def compose_run(overrides: list[str]):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return to_run_config(compose(config_name="config", overrides=overrides))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
def test_every_group_option_composes_onto_the_schema(group, option):
    run = compose_run([f"{group}={option}"])
    assert getattr(run, group) is not None


@pytest.mark.parametrize("experiment", options("experiment"))
def test_every_experiment_composes(experiment):
    compose_run([f"+experiment={experiment}"])


def test_defaults_are_the_documented_default_experiment():
    run = compose_run([])
    assert (run.model.name, run.mesh.engine, run.mesh.dp_shard, run.train.steps) == ("transformer", "fsdp2", -1, 20)


@pytest.mark.parametrize(
    "override,fragment",
    [
        ("+model.dimm=3", "dimm"),  # Hydra accepts `+key=` silently; the schema does not
        ("mesh.engine=fsdp3", "mesh.engine=fsdp3: allowed are fsdp2, fsdp1, ddp"),
        ("optim.name=lion", "optim.name=lion: allowed are adam, adamw, sgd"),
    ],
)
def test_schema_rejects_unknown_keys_and_choices(override, fragment):
    with pytest.raises(ConfigError, match=fragment):
        compose_run([override])


@pytest.mark.parametrize(
    "override,message",
    [
        ("train.steps=0", "error: train.steps=0: must be >= 1"),
        ("train.microbatches=3", "error: train.microbatches=3: must divide train.batch_size=4"),
        ("+experiment=no_such", "Could not find 'experiment/no_such'"),
        ("model.dim=abc", "Value 'abc' of type 'str' could not be converted to Integer"),
        ("mesh.dp_shard=3", "error: mesh.world_size=None"),
    ],
)
def test_bad_override_fails_fast_with_one_line_and_leaves_nothing(tmp_path, override, message):
    if override == "mesh.dp_shard=3":
        override, message = "mesh.dp_shard=3 mesh.world_size=2", "error: mesh.world_size=2, but pp=1 x dp_replicate=1 x dp_shard=3 x tp=1 = 3"
    result = run_lab(*override.split(), "logger=none", run_dir=tmp_path / "run", timeout=60)
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists(), "a refused run must leave no run dir"
