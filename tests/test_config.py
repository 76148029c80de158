"""Composition of every config group option and experiment, and one-line rejection of bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsdp_lab.config import ConfigError
from fsdp_lab.compose import CONF_DIR

GROUPS = ["model", "mesh", "wrap", "ac", "checkpoint", "optim", "probes", "logger"]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
def test_every_group_option_composes_onto_the_schema(compose_run, group, option):
    run = compose_run(f"{group}={option}")
    assert getattr(run, group) is not None


@pytest.mark.parametrize("experiment", options("experiment"))
def test_every_experiment_composes(compose_run, experiment):
    compose_run(f"+experiment={experiment}")


def test_defaults_are_the_documented_default_experiment(compose_run):
    run = compose_run()
    assert (run.model.name, run.mesh.engine, run.mesh.dp_shard, run.train.steps) == ("transformer", "fsdp2", -1, 20)


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "override,fragment",
    [
        ("+model.dimm=3", "dimm"),  # Hydra accepts `+key=` silently; the schema does not
        ("mesh.engine=fsdp3", "mesh.engine=fsdp3: allowed are fsdp2, fsdp1, ddp"),
        ("optim.name=lion", "optim.name=lion: allowed are adam, adamw, sgd"),
    ],
)
def test_schema_rejects_unknown_keys_and_choices(compose_run, override, fragment):
    with pytest.raises(ConfigError, match=fragment):
        compose_run(override)


def test_every_mode_has_its_checks_and_its_command_in_one_table():
    """validate.MODES is the one place a mode is looked up (run.py executes from it): every `mode=`
    the schema allows has an entry, and nothing else does."""
    from dataclasses import fields

    from fsdp_lab.config import RunConfig
    from fsdp_lab.validate import MODES

    allowed = next(f for f in fields(RunConfig) if f.name == "mode").metadata["allowed"]
    assert set(MODES) == set(allowed)
    assert all(callable(m.check) and callable(m.execute) for m in MODES.values())
