"""Read a run back from each tracker's own store, through the tracker's own formats and clients:
wandb's offline transaction log (its protobuf records), SwanLab's offline log, TensorBoard's event
files, and an MLflow tracking server's metric history. Each returns {key: [(step, value), …]}."""

from __future__ import annotations

import json
import struct
from collections import defaultdict
from pathlib import Path


def _leveldb_records(path: Path) -> list[bytes]:
    """wandb's .wandb file: a 7-byte header, then LevelDB log framing (32 KiB blocks, records
    split FIRST/MIDDLE/LAST); wandb 0.2x+ no longer ships a Python reader for it."""
    data, pos, out, buf, block = path.read_bytes(), 7, [], b"", 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # too little room for a header: the block's padding
            pos += block - pos % block
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if pos + 7 + n > len(data):  # cut off mid-record (a killed writer)
            break
        buf += data[pos + 7 : pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):  # FULL or LAST
            out.append(buf)
            buf = b""
    return out


def wandb_runs(root: Path) -> dict[str, list[dict]]:
    """Every offline run under root: {run id: [its records, one list per attempt]} with the run's
    name, project, config and history. An attempt killed before wandb's own process flushed its
    run record is listed under None."""
    from wandb.proto.wandb_internal_pb2 import Record

    runs: dict[str, list[dict]] = defaultdict(list)
    for path in sorted(root.glob("wandb/offline-run-*/run-*.wandb")):
        attempt = {"history": defaultdict(list), "tables": 0}
        for raw in _leveldb_records(path):
            rec = Record()
            rec.ParseFromString(raw)
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                attempt.update(
                    id=rec.run.run_id,
                    name=rec.run.display_name,
                    project=rec.run.project,
                    config={u.key: json.loads(u.value_json) for u in rec.run.config.update},
                )
            elif kind == "history":
                items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in rec.history.item}
                step = items["_step"]
                for k, v in items.items():
                    if k == "val/generations/_type":
                        attempt["tables"] += 1
                    elif not k.startswith("_") and isinstance(v, (int, float)):
                        attempt["history"][k].append((step, v))
        runs[attempt.get("id")].append(attempt)
    return runs


def swanlab_run(root: Path) -> dict:
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    (path,) = root.glob("swanlog/run-*/run-*.swanlab")
    reader = DataStoreReader()
    reader.open(path)
    run: dict = {"history": defaultdict(list), "texts": 0}
    for raw in reader:
        rec = Record()
        rec.ParseFromString(raw)
        if rec.HasField("start"):
            run.update(name=rec.start.name, project=rec.start.project, id=rec.start.id)
        elif rec.HasField("scalar"):
            run["history"][rec.scalar.key].append((rec.scalar.step, rec.scalar.value.number))
        elif rec.HasField("media") and rec.media.key == "val/generations":
            run["texts"] += len(rec.media.value.items)
    reader.close()
    return run


def tensorboard_history(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {k: [(e.step, e.value) for e in acc.Scalars(k)] for k in acc.Tags()["scalars"]}


def mlflow_history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    from mlflow import MlflowClient

    return [(m.step, m.value) for m in MlflowClient(uri).get_metric_history(run_id, key)]
