"""The whole configuration space tried generatively (tests/config_space.py draws it from the schema):
whatever a user composes is either refused before any rank starts with one ConfigError line (the CLI
prints it as `error: ...`, exit 2, nothing written) or it runs. Here, in process: every example is
checked, and the accepted estimates of the cheapest models are traced on the fake process group. The
slow tier (test_config_space_runs.py) traces every accepted estimate and plan, and trains a sample of
the accepted training configurations for real.

A failing example is shrunk by hypothesis and shown as the command line that reproduces it; the
examples it found are kept as @example regression cases (config_space_found.FOUND)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, note, seed, settings

from config_space import SEED, command_line, overrides
from config_space_check import accepted_or_refused, estimate_runs
from config_space_found import with_found

CHEAP = {"mlp", "mlp_stack", "transformer"}


@with_found
@seed(SEED)
@settings(max_examples=300, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])
@given(args=overrides())
def test_a_configuration_is_refused_in_one_line_or_accepted_and_a_cheap_estimate_runs(not_a_rank, args):
    note(command_line(args))
    checked = accepted_or_refused(args)
    if checked is None:
        return
    run, dims = checked
    if run.mode == "estimate" and run.model.name in CHEAP and dims.world_size <= 2 and dims.pp == 1:
        estimate_runs(args, run, dims)
