"""README.md's Layout section cannot go stale: every path it names exists, and it names every package
of fsdp_lab/ and every file of benchmarks/ (a name with `*` covers the files it matches)."""

from __future__ import annotations

import re
from fnmatch import fnmatch
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOP_DIRS = ("conf", "fsdp_lab", "benchmarks", "launchers", "scripts", "docs", "tests")
PATH = re.compile(rf"(?<![\w/.])(?:{'|'.join(TOP_DIRS)})/[\w./*-]*")


def layout_block(readme: str) -> str:
    section = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```", 2)[1]


def named_paths(block: str) -> set[str]:
    return {m.rstrip(".") for m in PATH.findall(block)}


def missing(names: set[str]) -> list[str]:
    return sorted(n for n in names if not any(REPO.glob(n.rstrip("/"))))


def unlisted(names: set[str]) -> list[str]:
    packages = [p.parent.relative_to(REPO).as_posix() + "/" for p in (REPO / "fsdp_lab").rglob("__init__.py")]
    benchmarks = [p.relative_to(REPO).as_posix() for p in (REPO / "benchmarks").iterdir() if p.is_file()]
    return sorted(p for p in packages if p != "fsdp_lab/" and p not in names) + sorted(
        b for b in benchmarks if not any(fnmatch(b, n) for n in names)
    )


def test_the_layout_names_only_paths_that_exist():
    assert missing(named_paths(layout_block((REPO / "README.md").read_text()))) == []


def test_the_layout_names_every_package_and_benchmark():
    assert unlisted(named_paths(layout_block((REPO / "README.md").read_text()))) == []


def test_the_check_sees_a_stale_layout():
    block = "fsdp_lab/estimate.py  gone\nbenchmarks/speed.py  kept\n"
    assert missing(named_paths(block)) == ["fsdp_lab/estimate.py"]
    assert "fsdp_lab/plan/" in unlisted(named_paths(block))
    assert "benchmarks/kernel_time.py" in unlisted(named_paths(block))
    assert "benchmarks/kernel_time.py" not in unlisted(named_paths("benchmarks/*_time.py  traces"))
