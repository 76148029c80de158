"""Two torchrun "nodes" on this machine (`--nnodes 2`, c10d rendezvous on localhost), one rank each:
one run, one run dir, written by both."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fsdp_lab.cli_process import REPO, lab_env
from worlds import free_port

pytestmark = pytest.mark.slow


def test_two_torchrun_nodes_train_one_run_into_one_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "two-nodes"]
    lab = ["-m", "fsdp_lab", "debug=cpu_tiny", "model.n_layers=1", "checkpoint=dcp", f"hydra.run.dir={run_dir}"]
    nodes = [subprocess.Popen(torchrun + lab, cwd=REPO, env=lab_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    assert sum(f"run dir: {run_dir}" in out for out in outputs) == 1, "rank 0 runs on one of the nodes"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["world_size"] == 2 and summary["mesh"]["dp_shard"] == 2
    assert summary["parity"]["ok"]
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    checkpoint = run_dir / "checkpoints" / "step_00000002"
    written = {p.relative_to(checkpoint).as_posix() for p in checkpoint.rglob("*") if p.is_file()}
    assert {"__0_0.distcp", "__1_0.distcp", "rng/rank0.pt", "rng/rank1.pt"} <= written, "both nodes wrote their shards"
    assert [p.name for p in tmp_path.iterdir()] == ["run"], "one run dir for both nodes"
