"""The whole configuration space tried generatively (tests/config_space.py draws it from the schema):
whatever a user composes is either refused before any rank starts with one ConfigError line (the CLI
prints it as `error: ...`, exit 2, nothing written) or it runs. Here, in process: every example is
checked, and the estimates accepted are traced on the fake process group. The slow tier
(test_config_space_runs.py) runs a sample of the accepted training configurations for real.

A failing example is shrunk by hypothesis and shown as the command line that reproduces it; the
examples it found are kept below as @example regression cases."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, example, given, note, settings

from config_space import command_line, overrides
from config_space_check import accepted_or_refused
from fsdp_lab.estimate import ESTIMATE_FILE, run_estimate

FOUND = [  # what the generative test found on main, each now refused in one line (docs/bad_input.md)
]


def _estimates(args: list[str]) -> None:
    checked = accepted_or_refused(args)
    if checked is None or checked[0].mode != "estimate":
        return
    run, dims = checked
    with tempfile.TemporaryDirectory() as tmp:
        try:
            run_estimate(run, dims, Path(tmp))
        except Exception as e:
            raise AssertionError(f"{command_line(args)}\n  accepted, then mode=estimate raised {type(e).__name__}: {e}") from e
        assert (Path(tmp) / ESTIMATE_FILE).exists(), f"{command_line(args)}\n  accepted, but the estimate wrote nothing"


def with_found(test):
    for args in FOUND:
        test = example(args=args)(test)
    return test


@with_found
@settings(max_examples=300, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])
@given(args=overrides(modes=("train", "train", "estimate", "estimate", "plan")))
def test_a_configuration_is_refused_in_one_line_or_accepted_and_an_accepted_estimate_runs(not_a_rank, args):
    note(command_line(args))
    _estimates(args)
