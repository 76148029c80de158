import sys
from pathlib import Path

# The test helpers (tests/lab.py, tests/wandb_records.py) import as top-level modules.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from lab import LAUNCHERS  # noqa: E402

# In-process composition (tests/test_config.py) needs the launcher plugins too (conf/config.yaml
# selects hydra/launcher=torchrun).
sys.path.insert(0, str(LAUNCHERS))


def pytest_terminal_summary(terminalreporter):
    """How many bad inputs and faults the suite tried (issue: the catalogue must be visible)."""
    for marker in ("bad_input", "fault"):
        tried = [
            r for key in ("passed", "failed")
            for r in terminalreporter.stats.get(key, [])
            if marker in getattr(r, "keywords", {})
        ]
        passed = sum(1 for r in tried if r.passed)
        terminalreporter.write_line(f"{marker} cases tried: {len(tried)}, handled as specified: {passed}")
