"""benchmarks/plan_vs_search.py: its comparison of the plan's ranking with measured trials (in process,
over a study and run dirs written here), and the whole script once on 2 CPU ranks with a tiny model."""

from __future__ import annotations

import json
import subprocess
import sys

import optuna
import pytest
from omegaconf import OmegaConf

from benchmark_scripts import BENCHMARKS, load
from fsdp_lab.cli_process import REPO, lab_env

pvs = load("plan_vs_search")


def layout(pp=1, rep=1, shard=2, tp=1, ac="none", mb=1, reshard=True) -> dict:
    return {"pp": pp, "dp_replicate": rep, "dp_shard": shard, "tp": tp, "ac": ac, "microbatches": mb, "reshard": reshard,
            "wrap_group": 1, "compile": False}


def measured_run(path, lay: dict, tokens_per_s: float):
    """A finished trial's run dir, as the lab writes it: the resolved config and summary.json."""
    (path / ".hydra").mkdir(parents=True)
    OmegaConf.save({"ac": {"mode": lay["ac"]}, "train": {"microbatches": lay["microbatches"]},
                    "fsdp": {"reshard_after_forward": lay["reshard"]}, "wrap": {"group": lay["wrap_group"]}, "model": {"compile": lay["compile"]}},
                   path / ".hydra" / "config.yaml")
    mesh = {k: lay[k] for k in ("pp", "dp_replicate", "dp_shard", "tp")}
    (path / "summary.json").write_text(json.dumps({"mesh": mesh, "perf": {"tokens_per_s": tokens_per_s}}))
    return path


def trial(state, value=None, **attrs):
    return optuna.trial.create_trial(state=state, value=value, params={}, distributions={}, user_attrs=attrs)


def test_compare_finds_where_the_plans_ranking_contradicts_the_measurements(tmp_path):
    fsdp, hsdp, ac, tp = layout(), layout(rep=2, shard=1), layout(ac="full"), layout(shard=1, tp=2)
    study = optuna.create_study(direction="maximize")
    ok = optuna.trial.TrialState.COMPLETE
    for name, lay, tokens in (("a", fsdp, 1000.0), ("a2", fsdp, 1100.0), ("b", hsdp, 1300.0), ("c", ac, 1310.0), ("d", tp, 500.0)):
        study.add_trial(trial(ok, tokens, run_dir=str(measured_run(tmp_path / name, lay, tokens))))
    study.add_trial(trial(optuna.trial.TrialState.FAIL, fail_reason="refused: train.microbatches=3: must divide train.batch_size=4"))
    picks = [measured_run(tmp_path / f"pick{i}", fsdp, tokens) for i, tokens in enumerate((1050.0, 900.0, 1200.0))]
    # The plan's order: fsdp (its pick, measured 1050: the median of its repeats), tp, hsdp, ac.
    candidates = [{"layout": fsdp, "fits": True, "tokens_per_s_per_gpu": 4000.0, "measured": {"run_dirs": [str(p) for p in picks]}},
                  {"layout": tp, "fits": True, "tokens_per_s_per_gpu": 3900.0},
                  {"layout": hsdp, "fits": True, "tokens_per_s_per_gpu": 3000.0},
                  {"layout": ac, "fits": True, "tokens_per_s_per_gpu": 2000.0}]
    result = pvs.compare({"candidates": candidates}, study)
    assert result["search_best"]["tokens_per_s"] == 1310.0 and result["search_best"]["plan_rank"] == 4
    assert result["plan_vs_search"] == pytest.approx(1050 / 1310)
    assert result["failed_trials"] == {5: "refused: train.microbatches=3: must divide train.batch_size=4"}
    # fsdp, measured twice, stands at its best (1100); hsdp vs ac differ by < 3%: not a ranked pair.
    pairs = {(pvs.key(d["faster_measured"]), pvs.key(d["plan_ranks_higher"])) for d in result["discordant_pairs"]}
    # fsdp over tp agrees with the plan; every other ranked pair has the plan's order reversed.
    expected = {(pvs.key(hsdp), pvs.key(fsdp)), (pvs.key(ac), pvs.key(fsdp)), (pvs.key(hsdp), pvs.key(tp)), (pvs.key(ac), pvs.key(tp))}
    assert pairs == expected and result["ranked_pairs"] == 5
    worst = result["discordant_pairs"][0]
    assert pvs.key(worst["faster_measured"]) == pvs.key(ac) and worst["plan_ranks"] == [4, 2]
    assert "reaches 80.2% of the search's best" in pvs.render({"comparison": result, "gpus": 2, "overrides": [], "validate": 1,
                                                              "plan": {"gpu_s": 10.0, "wall_s": 20.0}, "search": {"gpu_s": 100.0, "wall_s": 60.0}})


def test_a_layout_without_a_shard_group_is_the_plans_one_whatever_its_group(tmp_path):
    """The 8B study's best (tp 2, no sharding, wrap.group=4) was the plan's own pick, shown as unranked."""
    tp = {**layout(shard=1, tp=2, reshard=False), "wrap_group": 4}
    measured = pvs.measured_layout(measured_run(tmp_path / "tp", tp, 6246.0))
    assert (measured["wrap_group"], measured["reshard"]) == (1, True)
    sharded = {**layout(reshard=False), "wrap_group": 4}
    assert pvs.key(pvs.measured_layout(measured_run(tmp_path / "fsdp", sharded, 1.0))) == pvs.key(sharded)


def test_a_trial_left_running_by_a_killed_invocation_is_closed_as_failed(tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    assert pvs.close_interrupted(storage) == 0, "no study yet"
    study = optuna.create_study(study_name=pvs.STUDY, storage=storage)
    study.add_trial(trial(optuna.trial.TrialState.COMPLETE, 1.0))
    study.ask()  # a trial the killed invocation had started
    assert pvs.close_interrupted(storage) == 2
    last = optuna.load_study(study_name=pvs.STUDY, storage=storage).trials[-1]
    assert last.state == optuna.trial.TrialState.FAIL and last.user_attrs["fail_reason"].startswith("interrupted")


@pytest.mark.slow
def test_the_script_runs_the_plan_and_a_study_on_cpu_ranks_and_resumes_it_elsewhere(tmp_path):
    fixed = ["debug=cpu_tiny", "model.compile=false", "wrap.group=1", "ac=none", "fsdp.reshard_after_forward=true",
             "train.microbatches=1", "mesh.degrees=choice(pp1-rep1-tp1)", "plan.top=1",  # one layout; one row shown: one estimate
             # one validation run of the pick, not 3: the median over several run dirs is compare's (tested above),
             # the repeats themselves test_plan's plan.validate_repeats=2
             "plan.validate_repeats=1"]

    def script(out, *args):
        proc = subprocess.run([sys.executable, str(BENCHMARKS / "plan_vs_search.py"), *args, "--gpus", "2", "--out", str(out), "--", *fixed],
                              cwd=REPO, env=lab_env(), capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        return json.loads((out / "plan_vs_search.json").read_text()), proc.stdout

    first, _ = script(tmp_path / "a", "--trials", "1")
    r = first["comparison"]
    assert r["trials"] == 1 and r["measured_trials"] == 1 and r["search_best"]["tokens_per_s"] > 0
    assert r["plan_pick"]["measured_tokens_per_s"] > 0 and r["plan_vs_search"] > 0
    assert first["plan"]["gpu_s"] > 0 and first["search"]["gpu_s"] > 0, "each side's jobs ran on 2 ranks"
    assert "The plan against the search: 2 GPUs" in (tmp_path / "a" / "plan_vs_search.md").read_text()
    # The study goes on in a new sitting, its directory moved (another machine): past a deadline nothing
    # new starts; then one more trial, the one layout again, is answered from the study (no GPU time). The
    # plan is not run again, and the first trial's run dir is found where it is now.
    (tmp_path / "a").rename(tmp_path / "b")
    stopped, out = script(tmp_path / "b", "--trials", "2", "--deadline", "1")
    assert stopped["comparison"]["trials"] == 1 and "1 trials left for the deadline" in out
    second, _ = script(tmp_path / "b", "--trials", "2")
    r = second["comparison"]
    assert r["trials"] == 2 and r["measured_trials"] == 1 and r["repeated_trials"] == 1 and second["plan"] == first["plan"]
    assert r["search_best"]["tokens_per_s"] == first["comparison"]["search_best"]["tokens_per_s"]
    assert second["search"]["parts"] == 2 and second["search"]["gpu_s"] == first["search"]["gpu_s"]
