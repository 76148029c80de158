"""DCP checkpoints of a run: model + optimizer (+ the parity reference) as sharded state dicts, the
learning-rate schedule's position, the step, the RNG states and the data position, saved every
`checkpoint.interval` steps and at the end.

Layout, under `<run dir>/checkpoints/`:
    step_00000010/           a complete checkpoint: DCP's shards and `.metadata`, `rng/rank<R>.pt`,
                             and `meta.json`, written last (step, loss, config, a manifest of files
                             with their sizes and xxh3-64 checksums)
    .partial-step_00000020/  a save in progress, or one a crash interrupted: never resumed from

A save writes into the partial directory and renames it once every rank has finished, so a crash
leaves the previous checkpoint as the newest complete one. A checkpoint whose manifest does not
match its files (truncated, missing, changed content) is refused with an error naming the file;
`checkpoint.resume=auto` passes over it to the newest intact one, with a warning."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import xxhash
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from fsdp_lab.config import CheckpointConfig, ConfigError, RunConfig
from fsdp_lab.sinks.files import write_json_atomic

log = logging.getLogger(__name__)

CHECKPOINTS_DIR = "checkpoints"
META_FILE = "meta.json"
PARTIAL_PREFIX = ".partial-"
_STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed from; the message says which and why."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"checkpoint {path}: {reason}")
        self.reason = reason


def root_cause(e: BaseException) -> BaseException:
    """The first rank's own error inside DCP's CheckpointException (whose text is every rank's traceback)."""
    if isinstance(e, CheckpointException) and e.failures:
        return next(iter(e.failures.values()))[0]
    return e


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Published checkpoints of `run_dir`, oldest first (a partial save is never listed)."""
    root = run_dir / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def file_checksum(path: Path) -> str:
    """xxh3-64 of a file's content: over 10 GB/s, so checking a save costs a few percent of writing it
    (zlib's CRC-32 runs near 1-2 GB/s: about a fifth of a save). Reads and hashing release the GIL, so
    files are checked side by side in threads."""
    digest, buffer = xxhash.xxh3_64(), bytearray(1 << 22)
    view = memoryview(buffer)
    with path.open("rb", buffering=0) as f:
        while n := f.readinto(buffer):
            digest.update(view[:n])
    return digest.hexdigest()


def checksums(directory: Path, names: list[str]) -> dict[str, str]:
    with ThreadPoolExecutor(max_workers=min(8, len(names) or 1)) as pool:
        return dict(zip(names, pool.map(lambda name: file_checksum(directory / name), names)))


def read_meta(path: Path) -> dict:
    """The checkpoint's meta.json, which exists once its save has finished."""
    if not path.is_dir():
        raise CheckpointError(path, "no such directory")
    meta_path = path / META_FILE
    if not meta_path.exists():
        raise CheckpointError(path, f"incomplete: it has no {META_FILE}, which is written only once a save has finished")
    try:
        return json.loads(meta_path.read_text())
    except ValueError as e:
        raise CheckpointError(path, f"corrupt: {META_FILE} is not valid JSON ({e})") from None


def verify(path: Path) -> dict:
    """The checkpoint's meta.json after checking that every file it lists is there, with its size
    and content (its checksum) as saved."""
    meta = read_meta(path)
    manifest = meta["manifest"]
    for name, entry in manifest.items():
        file = path / name
        if not file.exists():
            raise CheckpointError(path, f"corrupt: {name} is missing")
        if file.stat().st_size != entry["bytes"]:
            raise CheckpointError(path, f"corrupt: {name} has {file.stat().st_size} bytes, expected {entry['bytes']}")
    for name, digest in checksums(path, list(manifest)).items():
        if digest != manifest[name]["xxh3_64"]:
            raise CheckpointError(path, f"corrupt: the content of {name} has changed since the save (xxh3-64 {digest}, saved {manifest[name]['xxh3_64']})")
    return meta


def check_compatible(path: Path, meta: dict, run: RunConfig) -> None:
    """A checkpoint resumes only the model and data stream it was saved for."""
    model = asdict(run.model)
    if meta["model"] != model:
        diff = {k: (meta["model"].get(k), v) for k, v in model.items() if meta["model"].get(k) != v}
        raise CheckpointError(path, f"saved for another model: (saved, now) = {diff}")
    if meta["data"]["seed"] != run.train.seed:
        raise CheckpointError(path, f"saved with train.seed={meta['data']['seed']}, this run has {run.train.seed}")


def resolve_resume(resume: str | None, run_dir: Path) -> Path | None:
    """The checkpoint to resume from: none, the newest complete one of `run_dir` (auto), or a PATH."""
    if resume is None:
        return None
    if resume == "auto":
        return newest_intact(run_dir)
    return Path(resume)


def agreed_resume(resume: str | None, run_dir: Path, rank: int) -> Path | None:
    """`resolve_resume` by rank 0, the one answer for every rank (collective)."""
    if resume != "auto":
        return resolve_resume(resume, run_dir)
    chosen = [resolve_resume(resume, run_dir) if rank == 0 else None]
    dist.broadcast_object_list(chosen, src=0)
    return chosen[0]


def newest_intact(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of `run_dir` that passes `verify`; damaged ones are named in a warning."""
    for path in reversed(complete_checkpoints(run_dir)):
        try:
            verify(path)
            return path
        except CheckpointError as e:
            log.warning("warning: %s; checkpoint.resume=auto passes over it to an older one", e)
    return None


def _file_sizes(directory: Path) -> dict[str, int]:
    return {str(p.relative_to(directory)): p.stat().st_size for p in sorted(directory.rglob("*")) if p.is_file()}


def share(sizes: dict[str, int], rank: int, world_size: int) -> list[str]:
    """The files `rank` checksums: the largest first, each to the least loaded rank."""
    load, mine = [0] * world_size, []
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        r = load.index(min(load))
        load[r] += sizes[name]
        if r == rank:
            mine.append(name)
    return mine


def _rng_state() -> dict:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


@dataclass
class _PendingSave:
    step: int
    partial: Path
    meta: dict
    future: Future | None  # async_save's; None once a blocking save has returned


def saves_after(step: int, interval: int, steps: int) -> bool:
    """Whether a run of `steps` steps saves a checkpoint after (1-based) step `step`."""
    return step % interval == 0 or step == steps


class Checkpointer:
    """Saves and restores a Trainer's state; every rank calls every method (they are collective)."""

    def __init__(self, run: RunConfig, run_dir: Path, trainer, rank: int, fault_point: Callable[[int, str], None]):
        self.cfg: CheckpointConfig = run.checkpoint
        self.run, self.trainer, self.rank = run, trainer, rank
        self.root = run_dir / CHECKPOINTS_DIR
        self.fault_point = fault_point
        # Its own gloo group: async saves run collectives from a background thread, and DCP needs
        # a CPU backend for them even when training uses NCCL.
        self.group = dist.new_group(backend="gloo")
        self.pending: _PendingSave | None = None
        self.resumed_from: Path | None = None
        self.last_saved: Path | None = None

    def _state_dict(self) -> dict:
        t = self.trainer
        state = dict(zip(("model", "optim"), get_state_dict(t.model, t.optimizer)))
        state["lr_scheduler"] = t.scheduler.state_dict()  # the reference's schedule is in step with it
        if t.reference is not None:
            state.update(zip(("ref_model", "ref_optim"), get_state_dict(t.reference.model, t.reference.optimizer)))
        return state

    def _dcp_load(self, state: dict, path: Path) -> None:
        try:
            dcp.load(state, checkpoint_id=str(path), process_group=self.group)
        except (Exception, CheckpointException) as e:
            cause = root_cause(e)
            raise CheckpointError(path, f"could not be loaded: {type(cause).__name__}: {cause}") from e

    # ---- saving -------------------------------------------------------------------------------

    def due(self, step: int) -> bool:
        """Whether a checkpoint is saved after (1-based) step `step`."""
        return saves_after(step, self.cfg.interval, self.run.train.steps)

    def after_step(self, step: int) -> None:
        if self.due(step):
            self.save(step)

    def save(self, step: int) -> None:
        self.finish()
        partial = self.root / f"{PARTIAL_PREFIX}{step_dir_name(step)}"
        if self.rank == 0:
            # Leftovers of saves a crash interrupted; no save is in flight now.
            for stale in self.root.glob(f"{PARTIAL_PREFIX}*"):
                shutil.rmtree(stale)
            (partial / "rng").mkdir(parents=True)
        dist.barrier(group=self.group)
        torch.save(_rng_state(), partial / "rng" / f"rank{self.rank}.pt")
        state = self._state_dict()
        meta = self._meta(step)
        if self.cfg.async_save:
            future = dcp.async_save(state, checkpoint_id=str(partial), process_group=self.group)
            self.pending = _PendingSave(step, partial, meta, future)
        else:
            dcp.save(state, checkpoint_id=str(partial), process_group=self.group)
            self.pending = _PendingSave(step, partial, meta, None)
            self.finish()

    def finish(self) -> None:
        """Wait for the save in flight, then make it visible: every rank's files first, then meta.json
        and the rename, so a crash at any point leaves only the previous checkpoint visible."""
        if self.pending is None:
            return
        pending, self.pending = self.pending, None
        if pending.future is not None:
            pending.future.result()
        dist.barrier(group=self.group)
        self.fault_point(pending.step, "save")
        dist.barrier(group=self.group)
        manifest = self._manifest(pending.partial)
        final = self.root / step_dir_name(pending.step)
        if self.rank == 0:
            write_json_atomic(pending.partial / META_FILE, {**pending.meta, "manifest": manifest})
            if final.exists():  # the same step saved again after a resume
                shutil.rmtree(final)
            os.replace(pending.partial, final)
            for old in complete_checkpoints(self.root.parent)[: -self.cfg.keep]:
                shutil.rmtree(old)
            log.info("checkpoint: step %d saved to %s", pending.step, final)
        self.last_saved = final

    def _manifest(self, directory: Path) -> dict[str, dict]:
        """Every file's size and checksum; the ranks share the reading."""
        sizes = _file_sizes(directory)
        gathered = [None] * dist.get_world_size(self.group)
        mine = checksums(directory, share(sizes, self.rank, len(gathered)))
        dist.all_gather_object(gathered, mine, group=self.group)
        digests = {name: digest for part in gathered for name, digest in part.items()}
        return {name: {"bytes": size, "xxh3_64": digests[name]} for name, size in sizes.items()}

    def _meta(self, step: int) -> dict:
        t = self.trainer
        ref = t.reference
        return {
            "step": step,
            "loss": t.last_loss,
            "time": time.time(),
            "world_size": dist.get_world_size(),
            "mesh": asdict(self.run.mesh),
            "model": asdict(self.run.model),
            "data": {"seed": self.run.train.seed, "next_step": step, "next_sample": t.data.next_sample(step)},
            "reference": ref is not None,
            "parity": {"max_loss_abs_diff": ref.verdict.max_loss_abs_diff, "max_param_abs_diff": ref.verdict.max_param_abs_diff}
            if ref is not None else None,
        }

    # ---- resuming -----------------------------------------------------------------------------

    def load(self, path: Path) -> int:
        """Restore the trainer from `path` (DCP reshards to this run's mesh); returns its step."""
        meta = read_meta(path)  # verified by resolve_resume or before the ranks started
        self._check_compatible(path, meta)
        t = self.trainer
        state = self._state_dict()
        if t.reference is not None and not meta["reference"]:
            # Saved without a parity reference: the reference starts again from the model's state.
            seed = {"model": state.pop("ref_model"), "optim": state.pop("ref_optim")}
            self._dcp_load(seed, path)
            state.update(ref_model=seed["model"], ref_optim=seed["optim"])
        self._dcp_load(state, path)
        set_state_dict(t.model, t.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        t.scheduler.load_state_dict(state["lr_scheduler"])
        if t.reference is not None:
            set_state_dict(t.reference.model, t.reference.optimizer, model_state_dict=state["ref_model"], optim_state_dict=state["ref_optim"])
            t.reference.scheduler.load_state_dict(state["lr_scheduler"])
            if meta["parity"] is not None:
                t.reference.verdict.update_loss(meta["parity"]["max_loss_abs_diff"])
                t.reference.verdict.update_params(meta["parity"]["max_param_abs_diff"])
        rng = path / "rng" / f"rank{self.rank}.pt"
        if meta["world_size"] == dist.get_world_size():
            _set_rng_state(torch.load(rng, weights_only=True))
        elif self.rank == 0:
            log.info("checkpoint: saved on %d ranks, resumed on %d: RNG states not restored", meta["world_size"], dist.get_world_size())
        t.last_loss = meta["loss"]
        t.data = t.data.resumed(meta["step"], meta["data"]["next_sample"])
        self.resumed_from = path
        if self.rank == 0:
            log.info("checkpoint: resumed from %s at step %d", path, meta["step"])
        return meta["step"]

    def _check_compatible(self, path: Path, meta: dict) -> None:
        check_compatible(path, meta, self.run)

    def summary(self) -> dict:
        return {
            "resumed_from": str(self.resumed_from) if self.resumed_from else None,
            "last_saved": str(self.last_saved) if self.last_saved else None,
        }


def check_checkpoint(run: RunConfig) -> None:
    c = run.checkpoint
    if c.kind == "dcp" and run.mesh.engine == "fsdp1" and run.ac.mode != "none" and run.ac.impl in ("wrapper", "outer_wrapper"):
        # torch's set_state_dict looks FSDP1's parameters up under their checkpoint_wrapper names
        # (KeyError on resume): a checkpoint that could not be loaded is not written at all.
        raise ConfigError(
            f"checkpoint.kind=dcp with mesh.engine=fsdp1 and ac.impl={run.ac.impl}: torch cannot load FSDP1 "
            "state through checkpoint wrappers; allowed: ac.impl=composable, utils or manual, or mesh.engine=fsdp2"
        )
    if c.resume not in (None, "auto"):
        try:
            check_compatible(Path(c.resume), verify(Path(c.resume)), run)
        except CheckpointError as e:
            raise ConfigError(f"checkpoint.resume={c.resume}: {e.reason}; allowed: auto, null, or a complete checkpoint") from None
