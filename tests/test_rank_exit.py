"""A rank leaves its process group with nothing of the model alive (fsdp_lab/worker.py release_frames):
DDP's C++ reducer holds the group, and left as its last holder it destroys the group holding the GIL,
which can hang the rank at its exit. rank_main runs here in the test process as rank 0 of 1, on a
FileStore as the lab's launch gives it, with a look at what is alive when it destroys the group."""

from __future__ import annotations

import gc
import signal

import pytest
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from fsdp_lab.dist import RANK_STORE_DIR
from fsdp_lab.worker import rank_main


@pytest.fixture
def as_rank_zero_of_one(monkeypatch, tmp_path, not_a_rank):
    """This process as the lab's launch starts rank 0 of 1; rank_main's SIGTERM handler undone after."""
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", RANK_STORE_DIR: str(tmp_path / "store")}.items():
        monkeypatch.setenv(key, value)
    (tmp_path / "store").mkdir()
    handler = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, handler)


@pytest.fixture
def ddp_alive_at_destroy(monkeypatch):
    """The DDP modules alive (after a collection) each time the process group is destroyed."""
    found = []
    destroy = dist.destroy_process_group

    def looking(*args, **kwargs):
        gc.collect()
        found.append(sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects()))
        return destroy(*args, **kwargs)

    monkeypatch.setattr(dist, "destroy_process_group", looking)
    return found


RUN = ["debug=cpu_tiny", "probes=off", "mesh=ddp", "mesh.world_size=1"]


def test_a_finished_rank_frees_the_model_before_leaving_the_group(prepared, as_rank_zero_of_one, ddp_alive_at_destroy, tmp_path):
    run, dims = prepared(*RUN)
    rank_main(run, str(tmp_path), dims)
    assert ddp_alive_at_destroy == [0]
    assert not dist.is_initialized()


def test_a_failed_rank_frees_the_model_its_error_passed_through(prepared, as_rank_zero_of_one, ddp_alive_at_destroy, tmp_path):
    run, dims = prepared(*RUN, "fault.kind=raise", "fault.kill_rank=0", "fault.at_step=1")
    with pytest.raises(RuntimeError, match="injected"):
        rank_main(run, str(tmp_path), dims)
    assert ddp_alive_at_destroy == [0]
    assert not dist.is_initialized()
