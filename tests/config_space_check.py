"""What must come of one configuration of the space: the pre-spawn check (Hydra composition, then
`fsdp_lab.validate.prepare`, as the CLI does) refuses it with one ConfigError line, or accepts it."""

from __future__ import annotations

from compose import prepared
from config_space import command_line
from fsdp_lab.config import ConfigError, RunConfig
from fsdp_lab.mesh import ParallelDims


def accepted_or_refused(args: list[str]) -> tuple[RunConfig, ParallelDims] | None:
    """The checked run and its dims, or None where it is refused as the CLI refuses (one line);
    anything else (a traceback, a message of several lines) fails with the command that reproduces it."""
    try:
        return prepared(*args)
    except ConfigError as e:
        message = str(e)
        assert message and "\n" not in message, f"{command_line(args)}\n  refused in more than one line: {message!r}"
        return None
    except Exception as e:
        raise AssertionError(f"{command_line(args)}\n  the check raised {type(e).__name__}: {e}") from e
