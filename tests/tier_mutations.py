"""Each parallelize step and each probe taken out in turn: a fast-tier test must fail every time.

    python tests/tier_mutations.py [NAME ...]     # all mutations, or the named ones

For each mutation this runs the fast-tier modules that cover it in a fresh pytest process, with this
file loaded as a pytest plugin (`-p tier_mutations`) that applies the mutation named in
$FSDP_LAB_MUTATION before any test runs, and prints the tests that failed. The modules are first run
unmutated (they must pass, so a failure is the mutation's). Exit 1 if a mutation goes unnoticed.

A step is replaced where the orchestrator looks it up (fsdp_lab.parallel, fsdp_lab.worker) by a no-op
that hands the model back as it came. A probe is either removed from the registry, or hollowed: still
registered and enabled, but every hook it defines is the protocol's do-nothing default.
`record_post_optim_event` is not here: on CPU it is a no-op by design (it records a CUDA event)."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

from fsdp_lab.probes import registry

TESTS = Path(__file__).resolve().parent
ENV_KEY = "FSDP_LAB_MUTATION"

STEP_TESTS = ("test_parallelize.py",)
PROBE_TESTS = ("test_probes.py", "test_one_rank.py")


def _step(module: str, name: str, no_op):
    """Replace `module.name` by `no_op(original)`."""
    def apply() -> None:
        import importlib

        target = importlib.import_module(module)
        setattr(target, name, no_op(getattr(target, name)))
    return apply


def _ac_taken_out(after_engine: bool):
    """apply_ac without one of its two calls: before the engine, or (ac.impl=outer_wrapper) after it."""
    def no_op(original):
        @functools.wraps(original)
        def apply_ac(model, cfg, **kwargs):
            if kwargs.get("after_engine", False) != after_engine:
                return original(model, cfg, **kwargs)
        return apply_ac
    return no_op


def _no_compile() -> None:
    torch.nn.Module.compile = lambda self, *args, **kwargs: None  # parallelize's `block.compile()`


def _probe_class(name: str):
    return next(cls for cls in registry.PROBES if cls.__name__ == name)


def _removed(name: str):
    def apply() -> None:
        registry.PROBES = tuple(cls for cls in registry.PROBES if cls.__name__ != name)
    return apply


def _hollowed(name: str):
    def apply() -> None:
        from fsdp_lab.probes.base import Probe

        cls = _probe_class(name)
        own = {k: getattr(Probe, k) for k in vars(cls) if callable(getattr(Probe, k, None)) and k != "enabled"}
        hollow = type(name, (cls,), own)
        registry.PROBES = tuple(hollow if c is cls else c for c in registry.PROBES)
    return apply


PROBE_NAMES = tuple(cls.__name__ for cls in registry.PROBES)

# name -> (apply, the fast-tier modules that cover it)
MUTATIONS = {
    "apply_tp": (_step("fsdp_lab.parallel", "apply_tp", lambda f: lambda *a, **k: None), STEP_TESTS),
    "apply_ac (before the engine)": (_step("fsdp_lab.parallel", "apply_ac", _ac_taken_out(after_engine=False)), STEP_TESTS),
    "apply_ac (after the engine)": (_step("fsdp_lab.parallel", "apply_ac", _ac_taken_out(after_engine=True)), STEP_TESTS),
    "compile": (_no_compile, STEP_TESTS),
    "wrap_units": (_step("fsdp_lab.parallel", "wrap_units", lambda f: lambda model, cfg: []), STEP_TESTS),
    "apply_fsdp2": (_step("fsdp_lab.parallel", "apply_fsdp2", lambda f: lambda model, *a, **k: model), STEP_TESTS),
    "apply_fsdp1": (_step("fsdp_lab.parallel", "apply_fsdp1", lambda f: lambda model, *a, **k: model), STEP_TESTS),
    "apply_ddp": (_step("fsdp_lab.parallel", "apply_ddp", lambda f: lambda model, *a, **k: model), STEP_TESTS),
    "build_pipeline": (_step("fsdp_lab.worker", "build_pipeline",
                             lambda f: lambda model, *, parallelize_stage, **k: parallelize_stage(model)), STEP_TESTS),
    "cast_after_sharding": (_step("fsdp_lab.worker", "cast_after_sharding", lambda f: lambda *a, **k: None), STEP_TESTS),
    **{f"{name} removed": (_removed(name), PROBE_TESTS) for name in PROBE_NAMES},
    **{f"{name} hollowed": (_hollowed(name), PROBE_TESTS) for name in PROBE_NAMES},
}


def pytest_configure(config) -> None:
    """As a plugin: apply the mutation named in the environment before any test module runs."""
    name = os.environ.get(ENV_KEY)
    if name:
        MUTATIONS[name][0]()


def run_fast_tier(modules: tuple[str, ...], mutation: str | None) -> tuple[int, list[str], float]:
    """(pytest's exit code, the tests that failed or errored, seconds)."""
    repo = TESTS.parent
    path = [str(TESTS), str(repo), str(repo / "launchers"), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p))
    env.pop(ENV_KEY, None)
    if mutation:
        env[ENV_KEY] = mutation
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tier_mutations", "-m", "not slow", "-rfE",
           *(str(TESTS / m) for m in modules)]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
    failed = re.findall(r"^(?:FAILED|ERROR) tests/(\S+::\S+)", proc.stdout, flags=re.M)
    return proc.returncode, failed, time.monotonic() - start


def main(names: list[str]) -> int:
    names = names or list(MUTATIONS)
    unknown = set(names) - set(MUTATIONS)
    if unknown:
        sys.exit(f"error: unknown mutations {sorted(unknown)}; allowed: {', '.join(MUTATIONS)}")
    for modules in sorted({MUTATIONS[n][1] for n in names}):
        code, failed, seconds = run_fast_tier(modules, None)
        print(f"unmutated {' '.join(modules)}: exit {code} in {seconds:.0f}s", flush=True)
        if code != 0:
            print("  the unmutated modules fail: " + ", ".join(failed))
            return 1
    unnoticed = []
    print("| taken out | fast tests failing | seconds | first failing tests |\n|---|---|---|---|")
    for name in names:
        code, failed, seconds = run_fast_tier(MUTATIONS[name][1], name)
        shown = ", ".join(failed[:3]) + (f", ... (+{len(failed) - 3})" if len(failed) > 3 else "")
        print(f"| {name} | {len(failed)} | {seconds:.0f} | {shown or 'NONE: not caught'} |", flush=True)
        if not failed:
            unnoticed.append(name)
    if unnoticed:
        print(f"not caught by the fast tier: {', '.join(unnoticed)}")
        return 1
    print(f"every one of {len(names)} mutations makes a fast-tier test fail")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
