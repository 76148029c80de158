"""Gradient clipping holds parity on every engine and mesh (and a norm over local shards only fails
it), a mid-schedule resume is bitwise equal to an uninterrupted run, and the localisation report
names the module whose gradients a fault corrupted: one set of 4 ranks (tests/clip_matrix.py)."""

from __future__ import annotations


import pytest

from clip_matrix import LOCAL_NORM, MESHES
from matrix_rank import launch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def matrix(tmp_path_factory) -> dict:
    return launch("clip_matrix", tmp_path_factory.mktemp("clip"), timeout=900, nproc=4)


@pytest.mark.parametrize("mesh", MESHES)
def test_clipping_holds_parity_on_every_mesh(matrix, mesh):
    result = matrix[f"clip/{mesh}"]
    parity, rows = result["parity"], result["rows"]
    assert all(r["grad/norm"] > 0.05 for r in rows), "the norm exceeds optim.max_norm: the gradients were clipped"
    assert parity["ok"], parity
    assert parity["max_grad_norm_abs_diff"] <= 1e-6 and all(r["parity/grad_norm_abs_diff"] <= 1e-6 for r in rows)
    assert parity["max_param_abs_diff"] <= 1e-6 and parity["max_loss_abs_diff"] <= 1e-5


@pytest.mark.parametrize("mesh", LOCAL_NORM)
def test_a_norm_over_the_local_shard_only_fails_the_verdict(matrix, mesh):
    parity, right = matrix[f"clip/{mesh}/local_norm"]["parity"], matrix[f"clip/{mesh}"]["rows"]
    assert not parity["ok"]
    assert parity["max_grad_norm_abs_diff"] > 0.05, "a shard's norm is a fraction of the whole"
    assert matrix[f"clip/{mesh}/local_norm"]["rows"][0]["grad/norm"] < right[0]["grad/norm"]


def test_resume_mid_schedule_is_bitwise_equal_to_an_uninterrupted_run(matrix):
    r = matrix["resume"]
    assert r["start"] == 2 and r["params_bitwise_equal"]
    assert [row["lr"] for row in r["whole"]] == [0.0005, 0.001, 0.00075, 0.0002500000000000001], "warm-up, then cosine"
    for key in ("loss", "lr", "grad/norm", "parity/loss_abs_diff"):
        assert [row[key] for row in r["resumed"]] == [row[key] for row in r["whole"][2:]], key
    assert r["schedules"] == [4, 4, 4, 4], "model's and reference's schedules restored and stepped alike"


def test_localisation_names_a_corrupted_block_in_the_middle_of_the_transformer(matrix):
    r = matrix["localize/fsdp_block"]
    assert not r["parity"]["ok"]
    localized = r["parity"]["localized"]
    # Replayed from before the step: outputs agree, the corrupted block's own gradients do not.
    assert localized["step"] == 2 and localized["forward_module"] is None
    assert localized["grad_module"].startswith("layers.2.")
    assert {"parity_report.json", "parity_report.md"} <= set(r["report_files"])


def test_localisation_after_the_step_names_the_first_parameter_that_differs(matrix):
    # Not replayed on parameters that already differ (it would blame the first module to run).
    localized = matrix["localize/fsdp_block_after"]["parity"]["localized"]
    assert localized["param"].startswith("layers.2.") and localized["forward_module"] is None


def test_localisation_names_the_corrupted_module_in_a_pipelined_run(matrix):
    localized = matrix["localize/pp"]["parity"]["localized"]
    assert localized["grad_module"] == "layers.2.feed_forward.w2" and localized["forward_module"] is None
