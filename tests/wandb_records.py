"""Reads an offline W&B run file (`run-*.wandb`) back. The file is a 7-byte header (":W&B", magic,
version) followed by LevelDB-log-format records (32 KiB blocks; each chunk has a CRC, a length and a
type: full, first, middle or last), each record a `wandb_internal_pb2.Record`."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_records(path: Path):
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, pending = HEADER, b""
    while pos + 7 <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < 7:  # the block's tail is zero padding
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == FULL:
            pending = chunk
        elif kind == FIRST:
            pending = chunk
            continue
        elif kind in (MIDDLE, LAST):
            pending += chunk
            if kind == MIDDLE:
                continue
        else:
            continue
        record = wandb_internal_pb2.Record()
        record.ParseFromString(pending)
        yield record


class OfflineRun:
    """The run's identity, config, metric definitions, logged history rows and summary, as W&B
    recorded them."""

    def __init__(self, path: Path):
        self.history: list[dict] = []
        self.summary: dict = {}
        self.config: dict = {}
        self.metric_definitions: dict = {}  # name or glob -> MetricRecord (step_metric, summary)
        self.run = None
        for record in read_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                self.run = record.run  # run_id, run_group, job_type, display_name, tags, ...
                self.config.update({_key(i): json.loads(i.value_json) for i in record.run.config.update})
            elif kind == "history":
                self.history.append({_key(i): json.loads(i.value_json) for i in record.history.item})
            elif kind == "summary":
                self.summary.update({_key(i): json.loads(i.value_json) for i in record.summary.update})
            elif kind == "metric":
                self.metric_definitions[record.metric.name or record.metric.glob_name] = record.metric
            elif kind == "config":
                self.config.update({_key(i): json.loads(i.value_json) for i in record.config.update})

    @classmethod
    def in_run_dir(cls, run_dir: Path) -> OfflineRun:
        files = sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
        assert len(files) == 1, f"expected one offline W&B run in {run_dir}, found {files}"
        return cls(files[0])


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)
