"""Every causal-LM family of the pinned transformers under model=hf: each built tiny from its own
config class (fsdp_lab.models.hf_families.tiny_config) and trained 2 steps with parity on fsdp, ddp
and hsdp, on tp2d where it declares a base_model_tp_plan, plus mode=estimate; refusals recorded
with their one-line reason. All runs share the ranks of one launch (no process per run). Writes
the rows as JSON and the table of docs/hf_families.md.

    python benchmarks/hf_families.py                      # every family, 4 CPU ranks
    python benchmarks/hf_families.py --families llama gpt2 --out /tmp/hf.json --doc none
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import sys
import traceback
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
DOC = REPO / "docs" / "hf_families.md"
TABLE_START, TABLE_END = "<!-- table: benchmarks/hf_families.py -->", "<!-- end of table -->"
RANKS = 4
SAMPLE_4_RANKS = ["llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "gpt2", "gpt_neox", "opt",
                  "falcon", "olmo2", "granite", "starcoder2"]
MESHES = {  # fsdp and ddp over 2 ranks; hsdp (2 x 2) and tp2d (dp 2 x tp 2) over 4
    "fsdp": ["mesh=fsdp"],
    "ddp": ["mesh=ddp"],
    "hsdp": ["mesh=hsdp"],
    "tp2d": ["mesh=tp2d"],
}
COMMON = ["train.steps=2", "train.seq_len=8", "train.batch_size=2", "probes.parity.param_every=1", "probes.perf.enabled=false",
          "probes.memory.enabled=false", "logger=none", "device=cpu"]


def common(ranks: int) -> list[str]:
    return [*COMMON, f"mesh.cpu_world_size={ranks}"]


def composer():
    """`prepared(*overrides) -> (RunConfig, ParallelDims)`: composed and checked as the CLI does."""
    from fsdp_lab.compose import prepared

    return prepared


def build_meta(model):
    from fsdp_lab.models import build_meta

    return build_meta(model)


def family_overrides(model_type: str) -> list[str]:
    from fsdp_lab.models.hf_families import tiny_overrides

    return tiny_overrides(model_type)


def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}"


def planned(model_type: str, meshes: list[str], ranks: int) -> dict:
    """In this process, before any rank: the refusal, or the meshes to train."""
    from fsdp_lab.config import ConfigError

    row: dict = {"family": model_type, "refused": None, "runs": {}}
    try:
        run, _ = composer()(*family_overrides(model_type), *common(ranks), "mesh=fsdp")
    except ConfigError as e:
        row["refused"] = str(e)
        return row
    except Exception as e:  # noqa: BLE001 - a family the lab neither runs nor refuses: the row says why
        row["error"] = one_line(e)
        return row
    tp = bool(getattr(build_meta(run.model).inner.config, "base_model_tp_plan", None))
    row["meshes"] = [m for m in meshes if m != "tp2d" or tp]
    return row


def with_estimate(row: dict, ranks: int) -> dict:
    """mode=estimate of the family on fsdp over the ranks (in this process, after the ranks: a fake
    trace's state must not reach forked ranks)."""
    from fsdp_lab.estimate import estimate

    if row["refused"] is None:
        try:
            run, dims = composer()(*family_overrides(row["family"]), *common(ranks), "mode=estimate", "mesh=fsdp", f"mesh.dp_shard={ranks}")
            row["estimate_mib"] = round(estimate(run, dims)["peak_mib"], 3)
        except Exception as e:  # noqa: BLE001 - the row says what failed
            row["estimate_error"] = one_line(e)
    return row


def _train(model_type: str, mesh: str, ctx) -> dict:
    """One family on one mesh over every rank of `ctx`: the parity verdict, or the refusal."""
    from fsdp_lab.config import ConfigError
    from fsdp_lab.worker import build_trainer

    try:
        run, dims = composer()(*family_overrides(model_type), *common(ctx.world_size), *MESHES[mesh])
    except ConfigError as e:
        return {"refused": str(e)}
    trainer = build_trainer(run, dims, ctx, on_step=lambda row: None)
    trainer.run()
    verdict = trainer.reference.verdict
    return {"parity_ok": verdict.ok, "max_loss_abs_diff": verdict.max_loss_abs_diff, "max_param_abs_diff": verdict.max_param_abs_diff,
            "loss": trainer.last_loss}


def rank_matrix(rows: list[dict], out_path: str) -> None:
    """In every rank: train each planned (family, mesh); rank 0 writes the rows."""
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    from fsdp_lab.dist import init_distributed

    ctx = init_distributed("cpu", timeout_s=120)
    for row in rows:
        for mesh in row.get("meshes", []):
            try:
                row["runs"][mesh] = _train(row["family"], mesh, ctx)
            except Exception as e:  # noqa: BLE001 - every rank raises alike; the row says what
                row["runs"][mesh] = {"error": one_line(e)}
                if ctx.is_main:
                    traceback.print_exc()
        if ctx.is_main:  # after every family: a matrix stopped midway keeps what it measured
            print(f"{row['family']}: " + ", ".join(f"{m} {cell(r)}" for m, r in row["runs"].items()), flush=True)
            Path(out_path).write_text(json.dumps(rows, indent=1))


def cell(result: dict | None) -> str:
    if result is None:
        return "-"
    if "refused" in result:
        return "refused"
    if "error" in result:
        return "error"
    return "parity ok" if result["parity_ok"] else f"parity FAILED ({result['max_loss_abs_diff']:.1e})"


def passes(row: dict, meshes=("fsdp", "ddp")) -> bool:
    return row["refused"] is None and all(row["runs"].get(m, {}).get("parity_ok") for m in meshes)


def table(rows: list[dict]) -> str:
    ok = sum(passes(r) for r in rows)
    lines = [
        TABLE_START, "",
        f"Measured {datetime.date.today()} with transformers {_transformers_version()} on CPU ranks (gloo: fsdp and ddp over 2, "
        f"hsdp and tp2d over 4 for the families issue 37 names), 2 steps, fp32, parity against DDP: {ok} of {len(rows)} families "
        "hold parity on fsdp and ddp; "
        f"{sum(r['refused'] is not None for r in rows)} are refused before any rank starts.", "",
        "| family | fsdp | ddp | hsdp | tp2d | estimate (MiB/rank) | why refused / what failed |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        notes = [f"{m}: {res.get('error') or res.get('refused')}" for m, res in r["runs"].items() if "error" in res or "refused" in res]
        if "estimate_error" in r:
            notes.append(f"estimate: {r['estimate_error']}")
        note = r["refused"] or r.get("error") or "; ".join(notes)
        estimate = f"{r['estimate_mib']:.2f}" if "estimate_mib" in r else ("error" if "estimate_error" in r else "-")
        lines.append(f"| {r['family']} | " + " | ".join(cell(r["runs"].get(m)) for m in MESHES) + f" | {estimate} | {note.replace('|', '/')} |")
    return "\n".join(lines + ["", TABLE_END])


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def write_doc(rows: list[dict], doc: Path) -> None:
    """Replace the table between its markers in `doc` (the prose around it is kept)."""
    text = doc.read_text() if doc.exists() else f"# Hugging Face families\n\n{TABLE_START}\n{TABLE_END}\n"
    head, _, rest = text.partition(TABLE_START)
    _, _, tail = rest.partition(TABLE_END)
    doc.write_text(head + table(rows) + tail)


def run_matrix(families: list[str], out: Path, meshes: list[str] = list(MESHES), ranks: int = RANKS) -> list[dict]:
    """Plan in this process, train in the ranks of one launch; returns the rows."""
    from fsdp_lab.spawn import launch

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    rows = [planned(f, meshes, ranks) for f in families]
    launch(rank_matrix, (rows, str(out)), n=ranks, run_dir=out.parent, max_restarts=0, start_method="fork")
    rows = [with_estimate(row, ranks) for row in json.loads(out.read_text())]
    out.write_text(json.dumps(rows, indent=1))
    return rows


def main() -> None:
    from fsdp_lab.models.hf_families import causal_lm_types

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="*", default=None, help="model types (default: every causal LM of the mapping)")
    parser.add_argument("--out", default="outputs/hf_families/rows.json")
    parser.add_argument("--doc", default=str(DOC), help="the page whose table to rewrite, or none")
    parser.add_argument("--keep", nargs="*", default=[], help="rows files of an earlier, stopped matrix: their families are not run again")
    parser.add_argument("--wider", action=argparse.BooleanOptionalAction, default=True,
                        help="also hsdp and tp2d on 4 ranks for the families issue 37 names")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    kept = {r["family"]: r for path in args.keep for r in json.loads(Path(path).read_text()) if r["runs"] or r["refused"] or r.get("error")}
    families = args.families or causal_lm_types()
    fresh = {r["family"]: r for r in run_matrix([f for f in families if f not in kept], out, meshes=["fsdp", "ddp"], ranks=2)}
    rows = [kept.get(f) or fresh[f] for f in families]
    rows = [r if "estimate_mib" in r or "estimate_error" in r else with_estimate(r, 2) for r in rows]
    # hsdp (2 x 2) and tp2d on 4 ranks: the families issue 37 names, which pass on fsdp and ddp.
    sample = [r["family"] for r in rows if args.wider and r["family"] in SAMPLE_4_RANKS and passes(r) and "hsdp" not in r["runs"]]
    if sample:
        wider = {r["family"]: r for r in run_matrix(sample, out.with_name("rows_4_ranks.json"), meshes=["hsdp", "tp2d"], ranks=4)}
        for r in rows:
            r["runs"].update(wider.get(r["family"], {}).get("runs", {}))
    out.write_text(json.dumps(rows, indent=1))
    if args.doc != "none":
        write_doc(rows, Path(args.doc))
    print(f"{sum(passes(r) for r in rows)} of {len(rows)} families hold parity on fsdp and ddp; rows: {out}")


if __name__ == "__main__":
    main()
