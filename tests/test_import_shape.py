"""Layers point one way: nothing the lab ships (fsdp_lab/, benchmarks/) imports the tests, and
fsdp_lab's sub-packages import each other without a cycle. Read from the source (ast), so a stray
import fails here before it is ever run."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "fsdp_lab"
# Names benchmarks/ scripts import from their own directory (benchmarks/ is on their sys.path).
TEST_MODULES = {p.stem for p in (REPO / "tests").glob("*.py")} - {p.stem for p in (REPO / "benchmarks").glob("*.py")}


def imports(path: Path) -> list[str]:
    """The absolute module names `path` imports, in functions too (`from a import b` gives `a.b`,
    which may be a module)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return names


def subpackages() -> list[str]:
    return sorted(".".join(p.parent.relative_to(REPO).parts) for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE)


def owner(module: str, packages: list[str]) -> str | None:
    """The innermost sub-package holding `module` (None for fsdp_lab's top-level modules)."""
    held = [p for p in packages if module == p or module.startswith(p + ".")]
    return max(held, key=len) if held else None


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


def package_graph() -> dict[str, set[str]]:
    """Sub-package -> the sub-packages its modules import (neither inside the other)."""
    packages = subpackages()
    graph: dict[str, set[str]] = {p: set() for p in packages}
    for path in PACKAGE.rglob("*.py"):
        source = owner(module_name(path), packages)
        if source is None:
            continue
        for name in imports(path):
            target = owner(name, packages)
            if target and not (target.startswith(source) or source.startswith(target)):
                graph[source].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One path per cycle found by depth-first search (enough to name what to untangle)."""
    found, done = [], set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            found.append(path[path.index(node):] + [node])
            return
        if node in done:
            return
        for nxt in sorted(graph[node]):
            visit(nxt, path + [node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
    return found


def test_nothing_shipped_imports_the_tests():
    offenders = [
        f"{path.relative_to(REPO)} imports {name}"
        for path in [*PACKAGE.rglob("*.py"), *(REPO / "benchmarks").glob("*.py")]
        for name in imports(path)
        if name == "tests" or name.startswith("tests.") or name.split(".")[0] in TEST_MODULES
    ]
    assert not offenders, offenders


def test_no_benchmark_puts_the_tests_on_its_path():
    offenders = [p.name for p in (REPO / "benchmarks").glob("*.py") if '"tests"' in p.read_text() or "'tests'" in p.read_text()]
    assert not offenders, offenders


def test_subpackages_import_each_other_one_way():
    # Function-level imports count too: they cannot leave a package half-initialized, but a cycle
    # through them still means neither package can be understood (or moved) without the other.
    assert cycles(package_graph()) == []


def test_the_cycle_check_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_each_model_family_owns_its_config():
    """A family is its module in fsdp_lab/models/ (config dataclass included), its conf file and its
    line in SPECS: the run-level schema (config.py) holds no family's fields."""
    import fsdp_lab.config
    from fsdp_lab.config import ModelConfig
    from fsdp_lab.models import SPECS

    for name, spec in SPECS.items():
        assert spec.config.__module__.startswith("fsdp_lab.models."), (name, spec.config.__module__)
        assert (REPO / "conf" / "model" / f"{name}.yaml").exists(), name
    in_config = [v.__name__ for v in vars(fsdp_lab.config).values() if isinstance(v, type) and issubclass(v, ModelConfig) and v is not ModelConfig]
    assert in_config == []
