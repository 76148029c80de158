"""torch elastic's settings for a run's local ranks (fsdp_lab/spawn.py launch_config): what a user's
launch.* keys become. NUMA binding itself needs GPUs (refused on CPU: tests/test_bad_input.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch.numa.binding import AffinityMode

from fsdp_lab.spawn import launch_config


@pytest.mark.parametrize("mode", ["node", "socket", "exclusive", "core-complex"])
def test_a_numa_binding_reaches_elastic_as_its_affinity_mode(mode):
    config = launch_config(n=4, run_dir=Path("/tmp/run"), max_restarts=0, start_method="spawn", numa_binding=mode)
    assert config.numa_options.affinity_mode == AffinityMode(mode)
    assert config.nproc_per_node == 4


def test_no_numa_binding_leaves_the_ranks_where_the_os_puts_them():
    config = launch_config(n=2, run_dir=Path("/tmp/run"), max_restarts=1, start_method="fork")
    assert config.numa_options is None
    assert config.max_restarts == 1
