"""torch elastic's settings for a run's local ranks (fsdp_lab/spawn.py launch_config): what a user's
launch.* keys become, and where NUMA binding is refused. The binding itself needs GPUs (refused on CPU:
tests/test_bad_input.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch.numa.binding import AffinityMode

from fsdp_lab.compose import compose_cfg, compose_run
from fsdp_lab.config import ConfigError
from fsdp_lab.dist import RANK_ENV_KEYS
from fsdp_lab import spawn
from fsdp_lab.launch_plan import cluster_world_size
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.spawn import check_launch, launch_config


@pytest.mark.parametrize("mode", ["node", "socket", "exclusive", "core-complex"])
def test_a_numa_binding_reaches_elastic_as_its_affinity_mode(mode):
    config = launch_config(n=4, run_dir=Path("/tmp/run"), max_restarts=0, start_method="spawn", numa_binding=mode)
    assert config.numa_options.affinity_mode == AffinityMode(mode)
    assert config.nproc_per_node == 4


def test_a_runs_numa_binding_reaches_its_launch(monkeypatch, tmp_path):
    """spawn_ranks hands the run's key to launch(), which builds elastic's settings from it (above)."""
    seen = {}
    monkeypatch.setattr(spawn, "launch", lambda entry, args, **kwargs: seen.update(kwargs))
    run = compose_run("launch.numa_binding=exclusive")  # composed, not checked: on this CPU it is refused
    spawn.spawn_ranks(run, ParallelDims.from_mesh(run.mesh, 2), tmp_path)
    assert seen["numa_binding"] == "exclusive" and seen["n"] == 2


def test_no_numa_binding_leaves_the_ranks_where_the_os_puts_them():
    config = launch_config(n=2, run_dir=Path("/tmp/run"), max_restarts=1, start_method="fork")
    assert config.numa_options is None
    assert config.max_restarts == 1


def test_numa_binding_is_refused_in_ranks_that_torchrun_started(monkeypatch):
    """Ranks started by torchrun or srun never pass through the lab's launch: the key would do nothing."""
    for key in RANK_ENV_KEYS:
        monkeypatch.setenv(key, "0" if key != "MASTER_ADDR" else "localhost")
    run = compose_run("launch.numa_binding=node")
    with pytest.raises(ConfigError, match=r"^launch.numa_binding=node: applies where the lab starts the ranks; torchrun or srun starts these: bind there \(torchrun --numa-binding"):
        check_launch(run, "cuda")
    monkeypatch.delenv("RANK")
    check_launch(run, "cuda")  # the lab's own launch: taken


def test_numa_binding_is_refused_before_a_slurm_job_is_submitted():
    """A SLURM job's ranks are its tasks: the launcher refuses the key before submitting, as for any bad input."""
    cfg = compose_cfg("launch.numa_binding=socket")
    with pytest.raises(ConfigError, match=r"^launch.numa_binding=socket: applies where the lab starts the ranks; SLURM \(a job's ranks are its tasks\) starts these"):
        cluster_world_size(cfg, gpus_per_node=2, nodes=1)
    assert cluster_world_size(compose_cfg(), gpus_per_node=2, nodes=1) == 2
