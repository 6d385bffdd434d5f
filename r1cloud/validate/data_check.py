"""What `validate` reads of a blueprint's local data before a GPU is rented, in one pass over each
file: its first ROWS rows checked whole and its first IMAGES images opened, the `<image>`
placeholders of its first PLACED rows counted against their images, and its row count — with one
line naming the file and row for what the trainer would stop at after the machines are up.

Rows are read as the trainer's data loader (🤗 datasets) reads those formats; a Hub data set
(`name@split`) is not downloaded here.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

from r1cloud.core.rows import conversation, image_source, placeholder_mismatch, row_videos

EXTENSIONS = (".jsonl", ".json", ".parquet", ".csv", ".arrow", ".txt")  # data/loader.py's builders
ROWS = 1000  # rows read from each file
IMAGES = 64  # images opened from each file


class DataError(Exception):
    """One line naming the file (and row) and what to do."""


def local_files(value: str) -> list[Path] | None:
    """The files of a local data value (`path[@split]`: a file, or a folder's files of the first
    one's type, as the data loader takes them); None for a Hub id; DataError when unusable."""
    path = Path(value.rpartition("@")[0] if "@" in value else value)
    try:
        path.stat()
    except (OSError, ValueError):  # not there, or not a path at all (validate/files.py says which)
        return None
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in EXTENSIONS and p.is_file())
        if not files:
            raise DataError(f"{path}: no data files ({', '.join(EXTENSIONS)}) in this folder")
        return [f for f in files if f.suffix == files[0].suffix]
    if not path.is_file():
        return None
    if path.suffix.lower() not in EXTENSIONS:
        raise DataError(
            f"{path}: {path.suffix or 'no extension'} is not a data file type; use {', '.join(EXTENSIONS)}"
        )
    return [path]


def rows(path: Path, limit: int = ROWS) -> Iterator[tuple[str, dict]]:
    """(where, row) for the first `limit` rows of a file; `where` names the row ('row 3', 'line 4');
    DataError for a file or row the loader cannot read."""
    kind = path.suffix.lower()
    read = {".parquet": _parquet, ".arrow": _arrow, ".csv": _text, ".txt": _text}.get(kind, _json)
    try:  # each reader yields (the row's line in the file, or None; the row)
        for i, (line, row) in enumerate(islice(read(path, limit), limit)):
            yield f"row {i}" + (f" (line {line})" if line else ""), row
    except DataError:
        raise
    except UnicodeDecodeError as e:
        raise DataError(f"{path.name} is not UTF-8 text (byte {e.start}): save it as UTF-8") from None
    except (OSError, ValueError, RecursionError, MemoryError) as e:
        what = {"parquet": "a parquet file", "arrow": "an Arrow file"}.get(kind.lstrip("."), "readable")
        raise DataError(f"{path.name} is not {what} ({type(e).__name__}: {str(e)[:120]})") from None


def _json(path: Path, limit: int) -> Iterator[tuple[int | None, dict]]:
    with open(path, encoding="utf-8") as f:
        head = f.read(4096).lstrip()
        f.seek(0)
        if head.startswith("["):  # a JSON array: the data loader reads it whole too
            data = _loads(f.read(), path.name)
            if not isinstance(data, list):
                raise DataError(f"{path.name} is not a JSON array of rows")
            for i, row in enumerate(data[:limit]):
                yield None, _row(row, f"row {i}", path)
            return
        for number, line in enumerate(f, 1):
            if line.strip():
                yield number, _row(_loads(line, f"{path.name}: line {number}"), f"line {number}", path)


def _loads(text: str, where: str):
    try:
        return json.loads(text)
    except RecursionError:
        raise DataError(f"{where} is nested too deeply to be a row") from None
    except ValueError as e:
        raise DataError(f"{where} is not JSON ({e}): one JSON object per line") from None


def _row(row, where: str, path: Path) -> dict:
    if not isinstance(row, dict):
        raise DataError(
            f"{path.name}: {where} holds a JSON {type(row).__name__}, not a row (an object of columns)"
        )
    return row


def _parquet(path: Path, limit: int) -> Iterator[tuple[None, dict]]:
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches(batch_size=min(limit, 256)):
        yield from ((None, row) for row in batch.to_pylist())


def _arrow(path: Path, limit: int) -> Iterator[tuple[None, dict]]:
    import pyarrow as pa

    with pa.memory_map(str(path)) as source:
        try:
            reader = pa.ipc.open_stream(source)  # what datasets' arrow builder reads
        except pa.ArrowInvalid:
            reader = pa.ipc.open_file(source)
        table = reader.read_all().slice(0, limit)
    yield from ((None, row) for row in table.to_pylist())


def _text(path: Path, limit: int) -> Iterator[tuple[int | None, dict]]:
    with open(path, encoding="utf-8", newline="") as f:
        if path.suffix.lower() == ".txt":  # datasets' text builder: one row per line, in a column named text
            yield from ((None, {"text": line.rstrip("\n")}) for line in f)
            return
        yield from ((i + 2, row) for i, row in enumerate(csv.DictReader(f)))


def count(path: Path) -> int | None:
    """How many rows the file holds, where that is cheap (parquet's metadata, counting lines);
    None when it is not."""
    kind = path.suffix.lower()
    try:
        if kind == ".parquet":
            import pyarrow.parquet as pq

            return pq.ParquetFile(path).metadata.num_rows
        if kind in (".jsonl", ".json", ".txt", ".csv"):
            with open(path, "rb") as f:
                if kind == ".json" and f.read(4096).lstrip().startswith(b"["):
                    return None
                f.seek(0)
                # blank lines are rows of a text file only
                found = sum(1 for line in f if kind == ".txt" or line.strip())
            return found - (kind == ".csv")  # less a csv file's header
    except (OSError, ValueError):
        return None
    return None


KINDS = {
    str: "text",
    int: "a number",
    float: "a number",
    bool: "true/false",
    dict: "an object",
    list: "a list",
}
PLACED = 20_000  # rows whose `<image>` placeholders are counted against their images


def _kind(value) -> str:
    return "null" if value is None else KINDS.get(type(value), type(value).__name__)


def _row_problem(row: dict, d, at: str, where: str, kinds: dict[str, tuple[str, str]]) -> str | None:
    """What the data loader would refuse in one row: a missing or mistyped prompt or answer, or a
    column whose type differs from an earlier row's (`kinds`: column -> (kind, where first seen))."""
    missing = [k for k in (d.prompt_key, d.answer_key) if k not in row]
    if missing:
        key = "data.prompt_key" if missing[0] == d.prompt_key else "data.answer_key"
        columns = ", ".join(sorted(map(str, row))[:8]) or "none"
        return f"{at} has no column {missing[0]!r} (its columns: {columns}); set {key} to the column to use"
    prompt, answer = row[d.prompt_key], row[d.answer_key]
    if isinstance(prompt, list):  # a conversation (TRL's conversational format)
        try:
            conversation(prompt, at)
        except ValueError as e:
            return str(e)
    elif not isinstance(prompt, str):
        return f"{at}: {d.prompt_key!r} is {_kind(prompt)}, not text: every prompt must be a string or a conversation"
    if answer is None or isinstance(answer, dict | list):
        return f"{at}: {d.answer_key!r} is {_kind(answer)}: the ground truth must be text or a number"
    for column, value in row.items():
        kind = _kind(value)
        seen = kinds.setdefault(column, (kind, where)) if kind != "null" else None
        if seen and seen[0] != kind:
            return f"{at}: {column!r} is {kind}, and {seen[0]} in {seen[1]}: a column holds one type; make them all alike"
    return None


def check_file(
    path: Path,
    d,
    added: int = 0,
    text_model: bool = False,
    limit_images: int = 0,
    no_videos: str | None = None,
) -> tuple[list[str], str | None]:
    """One pass over a local data file (what it reads: the module's docstring); `added`: the `<image>`
    placeholders the format prompt adds, `no_videos`: why the run takes no videos, if it takes none.
    Returns the problem (one line naming the file and row) and the first row's prompt (to render
    the format prompt over)."""
    first: str | None = None
    images = 0
    kinds: dict[str, tuple[str, str]] = {}
    try:
        for i, (where, row) in enumerate(rows(path, PLACED)):
            at = f"{path.name}: {where}"
            if i < ROWS:
                if message := _row_problem(row, d, at, where, kinds):
                    return [message], first
                if first is None:
                    first = row[d.prompt_key]
                    first = first[-1]["content"] if isinstance(first, list) else first
                for item in _items(row.get(d.image_key))[: max(0, IMAGES - images)]:
                    images += 1
                    if message := _image_problem(item, d.image_dir):
                        return [f"{at}: {message}"], first
            if message := _video_problem(row, d, f"{path.name}: row {i}", text_model, no_videos):
                return [message], first
            if d.image_key not in row:  # no image column: a text prompt, as EasyR1 decides
                continue
            found = _items(row[d.image_key])
            wanted = str(row.get(d.prompt_key, "")).count("<image>") + added
            if wanted != len(found):
                return [placeholder_mismatch(path.name, i, wanted, len(found), d)], first
            if limit_images and len(found) > limit_images:
                return [
                    f"{path.name}: row {i} has {len(found)} images, more than worker.rollout.limit_images "
                    f"({limit_images}): raise it, or 0 for the engine's own limit"
                ], first
            if found and text_model:
                return [
                    f"{path.name}: row {i} has images, and the model is text-only (its config has no "
                    f"vision_config): train a vision-language model, or drop the {d.image_key!r} column"
                ], first
    except DataError as e:
        return [str(e)], first
    if first is None:
        return [f"{path.name} holds no rows: a data set needs at least one"], first
    return [], first


def _video_problem(row: dict, d, at: str, text_model: bool, no_videos: str | None) -> str | None:
    """A row's videos against its `<video>` placeholders, the run and their files (data/loader.py reads them)."""
    videos = row_videos(row.get(d.video_key))
    wanted = str(row.get(d.prompt_key, "")).count("<video>")
    if wanted != len(videos):
        return f"{at} has {wanted} <video> in its prompt and {len(videos)} videos in {d.video_key!r}: put one <video> where each video goes"
    if videos and text_model:
        return f"{at} has videos, and the model is text-only (its config has no vision_config): train a vision-language model, or drop the {d.video_key!r} column"
    if videos and no_videos:
        return (
            f"{at} has videos, and {no_videos}: drop the {d.video_key!r} column, or give the frames as images"
        )
    for item in videos:
        source = image_source(item, d.image_dir) if isinstance(item, str) else None
        if source is not None and not os.path.isfile(source):
            where = "data.image_dir" if d.image_dir else "the working directory (data.image_dir is not set)"
            return f"{at}: video {item!r} not found (relative paths are joined with {where})"
    return None


def _items(value) -> list:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _image_problem(item, image_dir: str | None) -> str | None:
    """Why one image of a row cannot be opened, or None (only the file's header is read)."""
    from PIL import Image, UnidentifiedImageError

    source = image_source(item, image_dir)
    try:
        if isinstance(source, str):
            if not os.path.isfile(source):
                where = "data.image_dir" if image_dir else "the working directory (data.image_dir is not set)"
                name = item.get("path") if isinstance(item, dict) else item
                return f"image {name!r} not found (relative paths are joined with {where})"
            with Image.open(source):
                return None
        if isinstance(source, bytes | bytearray):
            with Image.open(io.BytesIO(source)):
                return None
    except (UnidentifiedImageError, OSError, ValueError) as e:
        return f"image {str(source)[:80]!r} is not an image PIL can read ({type(e).__name__})"
    return f"an image is a path, bytes or an HF Image dict, not {type(source).__name__}"


def count_rows(value: str | list[str]) -> int | None:
    """Rows of a local data value (or all of a mixture's), where countable without loading the
    data set; None when not (Hub ids, JSON arrays, Arrow files)."""
    total = 0
    for one in value if isinstance(value, list) else [value]:
        try:
            files = local_files(one) if one else None
        except DataError:
            return None
        counts = [count(f) for f in files or []]
        if not files or None in counts:
            return None
        total += sum(counts)
    return total
