"""The plan against the search, on the same GPUs and model: `mode=plan` (prediction on the CPU, its best
--validate candidates measured here) and an Optuna study of --trials measured layouts
(hydra/sweeper=layout_search). Reports the best measured layout of each, the GPU-seconds each spent
(jobs' wall time x their GPUs; a layout the lab refuses before starting costs none), and where the plan's
ranking disagrees with the measurements on the layouts the study ran.

    python benchmarks/plan_vs_search.py --trials 30 --out pvs_1b -- +experiment=bench_llama1b
    python benchmarks/plan_vs_search.py --trials 3 --gpus 2 --out /tmp/pvs -- debug=cpu_tiny   # CPU, tiny

Overrides go to both sides; choices (`ac=choice(none)`, `mesh.degrees=choice(pp1-rep1-tp2)`) narrow the
study only.

--deadline SECONDS: start no part of the study (--chunk trials) that might end past it, and write the
report of what ran; the same command again resumes (the plan and its measurements kept, the study
continued from OUT/study.db), so a study longer than one sitting on the GPUs is run in several:

    python benchmarks/plan_vs_search.py --trials 30 --gpus 2 --deadline 540 --out pvs_1b -- +experiment=bench_llama1b   # again until 30 ran

Both measure with the plan's validation settings (fsdp_lab.plan.validate_runs.RUN_OVERRIDES: 8 steps,
the first 3 left out, no parity reference, no W&B) and the same tokens per step (the plan's
samples_per_step as train.global_batch_size). Writes OUT/plan_vs_search.json and OUT/plan_vs_search.md."""

from __future__ import annotations

import argparse
import itertools
import statistics
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from hydra_plugins.fsdp_lab_launchers._trials import INTERRUPTED

from fsdp_lab.plan.run import PLAN_FILE
from fsdp_lab.plan.validate_runs import RUN_OVERRIDES, VALIDATE_DIR

REPO = Path(__file__).resolve().parent.parent
STUDY = "plan_vs_search"
NOISE = 0.03  # measured gaps below this are run-to-run noise: a ranking that swaps them does not disagree
LAYOUT_KEYS = ("pp", "dp_replicate", "dp_shard", "tp", "ac", "microbatches", "reshard", "wrap_group", "compile")


def lab(args: list[str], log: Path, *, ok_codes: tuple[int, ...] = (0,)) -> float:
    """`python -m fsdp_lab ARGS` as a user runs it (the launcher plugins on the path); its wall seconds."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "launchers"), str(REPO), env.get("PYTHONPATH", "")])
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.run([sys.executable, "-m", "fsdp_lab", *args], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode not in ok_codes:
        sys.exit(f"error: python -m fsdp_lab {' '.join(args)} exited {proc.returncode}; see {log}")
    return time.perf_counter() - start


def gpu_seconds(sweep_summary: Path) -> float:
    rows = json.loads(sweep_summary.read_text())["jobs"] if sweep_summary.exists() else []
    return sum((row["wall_s"] or 0) * (row["world_size"] or 0) for row in rows)


def fixed_only(overrides: list[str]) -> list[str]:
    """The overrides a single run takes: the study's choices (`ac=choice(none,full)`, `mesh.degrees=...`) left out."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    return [o.input_line for o in parsed if not o.is_sweep_override()]


def run_plan(out: Path, gpus: int, validate: int, device: str, overrides: list[str], progress: dict) -> dict:
    """The plan and its validation runs; a resumed benchmark keeps them as they were."""
    if "plan" not in progress:
        wall = lab(["mode=plan", f"plan.gpus={gpus}", f"plan.gpus_per_node={gpus}", f"plan.validate={validate}",
                    f"plan.top={max(15, validate)}", f"plan.device={device}", *fixed_only(overrides), f"hydra.run.dir={out / 'plan'}"],
                   out / "plan.log")
        validated = sorted((out / "plan" / VALIDATE_DIR).rglob("sweep_summary.json"))  # each candidate, each repeat
        progress["plan"] = {"wall_s": wall, "gpu_s": sum(gpu_seconds(p) for p in validated)}
        save(out, progress)
    return json.loads((out / "plan" / PLAN_FILE).read_text())


def run_search(out: Path, trials: int, samples: int, overrides: list[str], progress: dict, chunk: int,
               deadline: float | None, started: float) -> optuna.Study:
    """The study, --chunk trials a lab invocation (each into its own search/partK), until --trials were
    tried or the next part might end past the deadline."""
    storage = f"sqlite:///{out / 'study.db'}"
    search = progress.setdefault("search", {"wall_s": 0.0, "parts": 0, "trials_timed": 0})
    while (left := trials - close_interrupted(storage)) > 0:
        per_trial = search["wall_s"] / max(search["trials_timed"], 1)
        n = min(chunk, left)
        if deadline is not None and search["trials_timed"] and time.perf_counter() - started + per_trial * n > deadline:
            print(f"plan_vs_search: {left} trials left for the deadline ({deadline:.0f} s); the same command resumes the study")
            break
        part = out / "search" / f"part{search['parts']}"
        search["wall_s"] += lab(["-m", "hydra/sweeper=layout_search", f"hydra.sweeper.n_trials={n}", f"hydra.sweeper.study_name={STUDY}",
                                 f"hydra.sweeper.storage={storage}", f"hydra.sweep.dir={part}", f"train.global_batch_size={samples}",
                                 *RUN_OVERRIDES, *overrides], out / f"search_part{search['parts']}.log", ok_codes=(0, 1))  # 1: none completed
        search["parts"] += 1
        search["trials_timed"] += n
        save(out, progress)
    search["gpu_s"] = sum(gpu_seconds(p) for p in sorted((out / "search").glob("part*/sweep_summary.json")))
    return optuna.load_study(study_name=STUDY, storage=storage)


def close_interrupted(storage: str) -> int:
    """The study's trials so far (0 before it exists). A trial left running by a killed invocation is
    closed as failed, so that the study can go on (the layout stays untried)."""
    try:
        study = optuna.load_study(study_name=STUDY, storage=storage)
    except KeyError:  # optuna 2: no study of that name yet
        return 0
    for t in study.trials:
        if t.state == optuna.trial.TrialState.RUNNING:
            study._storage.set_trial_user_attr(t._trial_id, "fail_reason", f"{INTERRUPTED}: the benchmark was stopped mid-trial")
            study._storage.set_trial_state(t._trial_id, optuna.trial.TrialState.FAIL)
    return counted(study.trials)


def counted(trials) -> int:
    """Trials of the sweeper's n_trials: all but the repeats it gave to an untried layout."""
    return sum("replaced" not in t.user_attrs for t in trials)


def load_progress(out: Path) -> dict:
    """What earlier invocations with this --out did: the plan's cost, the study's parts and wall time, and
    the directories OUT was at (a resumed study's run dirs are found again under OUT wherever it is now)."""
    path = out / "progress.json"
    progress = json.loads(path.read_text()) if path.exists() else {"roots": []}
    if str(out.resolve()) not in progress["roots"]:
        progress["roots"].append(str(out.resolve()))
    return progress


def save(out: Path, progress: dict) -> None:
    (out / "progress.json").write_text(json.dumps(progress, indent=1))


def rebased(path: str, out: Path, roots: list[str]) -> Path:
    """A run dir recorded when OUT was elsewhere (the study resumed on another machine), under OUT now."""
    for root in roots:
        if path.startswith(root + os.sep):
            return out.resolve() / os.path.relpath(path, root)
    return Path(path)


def measured_layout(run_dir: Path) -> dict:
    """What a finished trial ran: the plan's layout fields and its measured tokens/s per GPU."""
    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    summary = json.loads((run_dir / "summary.json").read_text())
    sharded = summary["mesh"]["dp_shard"] > 1
    # Without a shard group there is nothing to regroup or reshard: the plan lists such a layout once,
    # at wrap.group=1 and resharding (plan/search.py layouts), and the study's draws of it are that one.
    return {**{k: summary["mesh"][k] for k in ("pp", "dp_replicate", "dp_shard", "tp")}, "ac": cfg.ac.mode,
            "microbatches": cfg.train.microbatches, "reshard": cfg.fsdp.reshard_after_forward if sharded else True,
            "wrap_group": cfg.wrap.group if sharded else 1, "compile": cfg.model.compile, "tokens_per_s": summary["perf"]["tokens_per_s"]}


def key(layout: dict) -> tuple:
    return tuple(layout[k] for k in LAYOUT_KEYS)


def compare(plan: dict, study: optuna.Study, where=Path) -> dict:
    """`where`: a recorded run dir's path here."""
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    measured = [measured_layout(where(t.user_attrs["run_dir"])) for t in done]
    # A layout the study measured more than once: its best run stands for it.
    best_per_key: dict[tuple, dict] = {}
    for m in sorted(measured, key=lambda m: -m["tokens_per_s"]):
        best_per_key.setdefault(key(m), m)
    predicted = {key(c["layout"]): (rank, c) for rank, c in enumerate(plan["candidates"], 1)}
    pairs, discordant = 0, []
    for a, b in itertools.combinations([m for k, m in best_per_key.items() if k in predicted], 2):
        gap = a["tokens_per_s"] / b["tokens_per_s"] - 1
        if abs(gap) < NOISE:
            continue
        pairs += 1
        if (gap > 0) != (predicted[key(a)][0] < predicted[key(b)][0]):
            faster, slower = (a, b) if gap > 0 else (b, a)
            discordant.append({"faster_measured": faster, "plan_ranks_higher": slower, "measured_gap": abs(gap),
                               "plan_ranks": [predicted[key(faster)][0], predicted[key(slower)][0]]})
    plan_pick = next((c for c in plan["candidates"] if c["fits"]), None)
    plan_measured = (plan_pick or {}).get("measured") or {}
    plan_tokens = None
    if plan_measured.get("run_dirs"):  # the validation's repeats: their median, as the plan reports step time
        plan_tokens = statistics.median(json.loads((where(d) / "summary.json").read_text())["perf"]["tokens_per_s"]
                                        for d in plan_measured["run_dirs"])
    best = max(measured, key=lambda m: m["tokens_per_s"]) if measured else None
    return {
        "plan_pick": plan_pick and {**plan_pick["layout"], "predicted_tokens_per_s": plan_pick["tokens_per_s_per_gpu"],
                                    "measured_tokens_per_s": plan_tokens, "error": plan_measured.get("error")},
        "search_best": best and {**best, "plan_rank": predicted.get(key(best), (None,))[0]},
        "plan_vs_search": plan_tokens / best["tokens_per_s"] if plan_tokens and best else None,
        "trials": counted(study.trials),
        "measured_trials": sum("repeat_of" not in t.user_attrs for t in done),
        "repeated_trials": sum("repeat_of" in t.user_attrs for t in study.trials),
        "failed_trials": {t.number: t.user_attrs.get("fail_reason") for t in study.trials
                          if t.state == optuna.trial.TrialState.FAIL and "repeat_of" not in t.user_attrs},
        "ranked_pairs": pairs, "discordant_pairs": sorted(discordant, key=lambda d: -d["measured_gap"]),
    }


def layout_name(m: dict) -> str:
    extra = "".join(f" {k}={m[k]}" for k in ("wrap_group", "compile") if k in m)
    return (f"pp{m['pp']} rep{m['dp_replicate']} shard{m['dp_shard']} tp{m['tp']} ac={m['ac']} mb{m['microbatches']} "
            f"reshard={str(m['reshard']).lower()}{extra}")


def render(result: dict) -> str:
    r, plan, search = result["comparison"], result["plan"], result["search"]
    pick, best = r["plan_pick"], r["search_best"]
    tok = lambda v: "-" if v is None else f"{v:,.0f}"  # noqa: E731
    lines = [f"# The plan against the search: {result['gpus']} GPUs, {' '.join(result['overrides']) or 'defaults'}", "",
             "| | best layout | tokens/s per GPU (measured) | GPU-s | wall s |", "|---|---|---|---|---|",
             f"| plan (validate={result['validate']}) | {layout_name(pick) if pick else 'none fits'} | {tok(pick and pick['measured_tokens_per_s'])}"
             f" (predicted {tok(pick and pick['predicted_tokens_per_s'])}) | {plan['gpu_s']:.0f} | {plan['wall_s']:.0f} |",
             f"| search ({r['trials']} trials, {r['measured_trials']} completed; {r['repeated_trials']} repeats answered from the study) | {layout_name(best) if best else 'none completed'} | "
             f"{tok(best and best['tokens_per_s'])} (plan rank {best and best['plan_rank']}) | {search['gpu_s']:.0f} | {search['wall_s']:.0f} |", ""]
    if r["plan_vs_search"]:
        lines.append(f"The plan's pick reaches {r['plan_vs_search']:.1%} of the search's best, for "
                     f"{plan['gpu_s'] / max(search['gpu_s'], 1e-9):.1%} of its GPU-seconds.")
    lines += ["", f"Ranking: {len(r['discordant_pairs'])} of {r['ranked_pairs']} measured pairs (gap >= {NOISE:.0%}) ordered "
              "otherwise by the plan:"]
    lines += [f"- {layout_name(d['faster_measured'])} measured {d['measured_gap']:.1%} faster than {layout_name(d['plan_ranks_higher'])}"
              f" (the plan ranks them {d['plan_ranks'][0]} and {d['plan_ranks'][1]})" for d in r["discordant_pairs"][:10]]
    return "\n".join(lines)


def use_gpus(gpus: int | None) -> tuple[int, list[str]]:
    """The world both sides get, and the overrides that set it: the first `gpus` visible GPUs (every
    one by default), or on a CPU `gpus` ranks (2 by default)."""
    import torch

    visible = torch.cuda.device_count()
    if not visible:
        return gpus or 2, [f"mesh.cpu_world_size={gpus or 2}"]
    gpus = gpus or visible
    if gpus > visible:
        sys.exit(f"error: --gpus={gpus}: only {visible} GPUs are visible")
    ids = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(visible)))).split(",") if g]
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(ids[:gpus])  # the lab's runs, started below, see these
    return gpus, []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=30, help="Optuna trials (refused layouts count as trials)")
    parser.add_argument("--validate", type=int, default=1, help="the plan's best candidates measured")
    parser.add_argument("--gpus", type=int, default=None, help="default: the visible GPUs (CPU: 2 ranks)")
    parser.add_argument("--device", default="h100-80gb", help="the plan's device table")
    parser.add_argument("--deadline", type=float, default=None, help="seconds; the same command again resumes")
    parser.add_argument("--chunk", type=int, default=5, help="trials a lab invocation of the study")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("overrides", nargs="*", help="the lab's overrides for the model and run, after --")
    args = parser.parse_args()
    started = time.perf_counter()
    gpus, world = use_gpus(args.gpus)
    args.out.mkdir(parents=True, exist_ok=True)
    overrides = list(args.overrides) + world
    progress = load_progress(args.out)
    plan = run_plan(args.out, gpus, args.validate, args.device, overrides, progress)
    study = run_search(args.out, args.trials, plan["samples_per_step"], overrides, progress, args.chunk, args.deadline, started)
    result = {"gpus": gpus, "overrides": args.overrides, "validate": args.validate, "plan": progress["plan"],
              "search": progress["search"],
              "comparison": compare(plan, study, lambda d: rebased(d, args.out, progress["roots"]))}
    (args.out / "plan_vs_search.json").write_text(json.dumps(result, indent=1, default=str))
    text = render(result)
    (args.out / "plan_vs_search.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
