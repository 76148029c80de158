"""How a W&B run of a sweep job is named, grouped and typed, and how secrets are masked: pure functions, no processes."""

from __future__ import annotations

from fsdp_lab.sinks.secrets import MASK, scrub, secret_values
from fsdp_lab.sinks.wandb_sink import mesh_job_type
from fsdp_lab.sweep import job_label, swept_keys, sweep_group


def test_group_is_the_sweep_dir_below_sweeps_or_its_name():
    assert sweep_group("outputs/sweeps/2025-01-31/12-00-00-4242") == "2025-01-31/12-00-00-4242"
    assert sweep_group("/data/sweeps/mesh_study") == "mesh_study"
    assert sweep_group("/tmp/mesh_study") == "mesh_study"


def test_name_is_the_swept_overrides_of_the_job():
    varied = swept_keys(["mesh=fsdp,hsdp", "ac=none,full", "train.steps=2", "+experiment=glob(*)", "optim.lr=range(1,3)"])
    assert varied == {"mesh", "ac", "experiment", "optim.lr"}
    job = ["mesh=hsdp", "ac=full", "train.steps=2", "+experiment=hsdp_accum", "optim.lr=2"]
    assert job_label(job, varied) == "mesh=hsdp,ac=full,+experiment=hsdp_accum,optim.lr=2"
    assert job_label(job, None) == ",".join(job), "unknown sweep: every override"
    assert job_label([], None) == ""


def test_job_type_is_the_engine_and_the_mesh():
    assert mesh_job_type("fsdp2", {"pp": 1, "dp_replicate": 2, "dp_shard": 4, "tp": 1}) == "fsdp2-dp_replicate2xdp_shard4"
    assert mesh_job_type("ddp", {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "tp": 1}) == "ddp-1rank"


def test_secret_values_come_from_credential_like_variables():
    env = {"WANDB_API_KEY": "k" * 40, "MY_SERVICE_TOKEN": "tok-123456", "DB_PASSWORD": "hunter2!!",
           "HOME": "/root", "SHORT_TOKEN": "1", "GH_SECRET": "s" * 8}
    assert secret_values(env) == ["k" * 40, "tok-123456", "hunter2!!", "s" * 8]


def test_scrub_masks_secret_named_strings_and_secret_values_only():
    secrets = ["tok-123456"]
    config = {
        "logger": {"tags": ["lab", "tok-123456"], "project": "p"},
        "name": "run-tok-123456",
        "service": {"api_key": "abc", "password": "pw", "token_budget": 5},
        "perf": {"tokens_per_s": 12.5},
    }
    assert scrub(config, secrets) == {
        "logger": {"tags": ["lab", MASK], "project": "p"},
        "name": f"run-{MASK}",
        "service": {"api_key": MASK, "password": MASK, "token_budget": 5},
        "perf": {"tokens_per_s": 12.5},
    }
