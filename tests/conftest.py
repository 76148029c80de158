import sys
from contextlib import ExitStack, nullcontext
from pathlib import Path

import pytest

# The test helpers (tests/in_process.py, tests/worlds.py, ...) import as top-level modules.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fsdp_lab.cli_process import LAUNCHERS  # noqa: E402

# In-process composition needs the launcher plugins too (conf/config.yaml selects hydra/launcher=torchrun).
sys.path.insert(0, str(LAUNCHERS))
from fsdp_lab import compose  # noqa: E402
import worlds  # noqa: E402
from tiers import MARKER, in_process_only  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def no_user_cache(tmp_path_factory):
    """layout=auto's kept choices (fsdp_lab/layout_cache.py) go to a directory of this session's, never
    the user's; set before any module-scoped fixture starts a run."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FSDP_LAB_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(autouse=True)
def keep_choices_apart(monkeypatch, tmp_path_factory):
    """Each test its own directory: no test takes a choice another test's run made."""
    monkeypatch.setenv("FSDP_LAB_CACHE", str(tmp_path_factory.mktemp("cache")))


def _tier_guard(item):
    return nullcontext() if item.get_closest_marker(MARKER) else in_process_only(item.nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    with _tier_guard(item):  # module fixtures are set up here, on behalf of their first test
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with _tier_guard(item):
        yield


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(items):
    """pytest-xdist (`--dist loadgroup`) hands out tests one by one, except that the tests sharing a
    module-scoped fixture (a run several tests read) form one group, run on one worker, so the
    fixture runs once. The files with the most slow tests go first, each file's tests in their order:
    the long groups start early and single tests fill the end, instead of one worker running a long
    file alone while the other idles."""
    slow = {}
    for item in items:
        slow[item.path] = slow.get(item.path, 0) + bool(item.get_closest_marker(MARKER))
        if any(d.scope != "function" for defs in item._fixtureinfo.name2fixturedefs.values() for d in defs
               if d.baseid and item.nodeid.startswith(d.baseid)):
            item.add_marker(pytest.mark.xdist_group(item.path.name))
    items.sort(key=lambda item: -slow[item.path])  # stable: a file's tests keep their order


@pytest.fixture
def not_a_rank(monkeypatch):
    """The environment of a user's shell, whatever started pytest: this process is no rank."""
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)


@pytest.fixture
def compose_run(not_a_rank):
    """`compose_run(*overrides) -> RunConfig`: conf/ composed by Hydra and typed, as the CLI does."""
    return compose.compose_run


@pytest.fixture
def prepared(not_a_rank):
    """`prepared(*overrides) -> (RunConfig, ParallelDims)`: composed and checked as the CLI does
    before any rank starts (raises the ConfigError the CLI prints as `error: ...`)."""
    return compose.prepared


@pytest.fixture
def fake_group():
    """`fake_group(world_size, rank=0)`: this process as `rank` of a fake process group (collectives
    do nothing), until the test ends or joins another: for what parallelizing builds."""
    joined = ExitStack()

    def join(world_size: int, rank: int = 0) -> None:
        joined.close()
        joined.enter_context(worlds.fake_group(world_size, rank))

    with joined:
        yield join


@pytest.fixture
def world_of_one(not_a_rank):
    """A real gloo process group of this process alone (rank 0 of 1); yields its DistContext."""
    with worlds.world_of_one() as ctx:
        yield ctx


@pytest.fixture
def on_one_rank(world_of_one):
    """`on_one_rank(*overrides) -> (run, model)`: the parallelized tiny model of a 1-rank run (mesh=single)."""
    return lambda *overrides: worlds.tiny_model_on_one_rank(world_of_one, *overrides)


def pytest_terminal_summary(terminalreporter):
    """How many bad inputs and faults the suite tried (the catalogue must be visible)."""
    for marker in ("bad_input", "fault"):
        tried = [
            r for key in ("passed", "failed")
            for r in terminalreporter.stats.get(key, [])
            if marker in getattr(r, "keywords", {})
        ]
        passed = sum(1 for r in tried if r.passed)
        terminalreporter.write_line(f"{marker} cases tried: {len(tried)}, handled as specified: {passed}")
