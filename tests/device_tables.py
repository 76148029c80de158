"""Reading the shipped device tables in tests: a host section is one section, or one per rank count
it was timed on ({"by_gpus": {"2": section, ...}}, fsdp_lab/plan/host.py host_section)."""

from __future__ import annotations


def host_sections(host: dict) -> list[dict]:
    """Every host section of a table's `host`, whichever shape it has."""
    return list(host["by_gpus"].values()) if "by_gpus" in host else [host]
