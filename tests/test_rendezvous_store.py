"""Where a run's ranks meet (fsdp_lab/spawn.py, fsdp_lab/dist.py rank_store): on a FileStore of the
launch, a new file each attempt, never on the TCP port elastic found free and let go (another process
can take it first); the launch leaves the launching process's environment as it was and removes the
store. Real ranks through torch elastic, forked from a warm process as tests/test_rank_failures.py's."""

from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.elastic.rendezvous.api as rendezvous_api

from fsdp_lab.dist import RANK_STORE_DIR, close_distributed, init_distributed
from fsdp_lab.spawn import launch
from warm_lab import in_a_warm_process

pytestmark = pytest.mark.slow


def meets_and_sums(out: str, fail_first_attempt: bool) -> None:
    """A rank: joins the group and all-reduces its rank + 1; rank 0 records the attempt, the sum and
    the store files the attempt sees. With fail_first_attempt the first attempt's rank 1 is then
    killed, so the run meets again."""
    ctx = init_distributed("cpu", timeout_s=60)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    total = torch.tensor([ctx.rank + 1.0])
    dist.all_reduce(total)
    if ctx.rank == 0:
        store_dir = os.environ[RANK_STORE_DIR]
        with open(out, "a") as f:
            f.write(json.dumps({"attempt": attempt, "sum": total.item(), "dir": store_dir, "files": sorted(os.listdir(store_dir))}) + "\n")
    if fail_first_attempt and attempt == "0" and ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # killed: its store file is left behind as it was
    close_distributed(failed=False)


def launch_with_the_port_taken(run_dir: str, out: str, max_restarts: int) -> None:
    """In the warm process: the race lost on purpose. Every port elastic finds free for the ranks is
    already listened on by another socket, as when another process took it in between (the dynamic
    rendezvous found one; the static one the lab launches with gives none, MASTER_PORT=0)."""
    taken = socket.socket()
    taken.bind(("localhost", 0))
    taken.listen()
    rendezvous_api.get_free_port = lambda: taken.getsockname()[1]
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # elastic's own store is not the ranks' port
    launch(meets_and_sums, (out, max_restarts > 0), n=2, run_dir=Path(run_dir), max_restarts=max_restarts, start_method="fork")
    print(f"after: {os.environ.get(RANK_STORE_DIR, 'unset')}")


@pytest.mark.parametrize("max_restarts", [0, 1])
def test_ranks_meet_on_a_store_of_the_launch_a_new_one_each_attempt(max_restarts, tmp_path):
    out = tmp_path / "attempts.jsonl"
    code, stdout, stderr = in_a_warm_process(launch_with_the_port_taken, (str(tmp_path / "run"), str(out), max_restarts), timeout=120)
    assert code == 0, stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    # Both ranks met and summed (1 + 2), on every attempt.
    assert [(r["attempt"], r["sum"]) for r in rows] == [(str(a), 3.0) for a in range(max_restarts + 1)]
    # Each attempt met on a store file of its own: the restarted one's is new, not the killed one's.
    assert all(f"attempt-{r['attempt']}" in r["files"] for r in rows), rows
    assert "after: unset" in stdout.splitlines(), "the launch leaves the launching process's environment as it was"
    assert not Path(rows[0]["dir"]).exists(), "the launch removes its store"
