"""Files a blueprint names: found (relative to the blueprint's folder, then the working directory,
as EasyR1 resolves them), made absolute in the resolved spec, and checked — where EasyR1 silently
turns a missing prompt or reward file into None, r1cloud stops with the path it looked for.

The reward function is checked by reading its source (ast), never by importing it: validation
must not run user code or pull in its imports.
"""

from __future__ import annotations

import ast
import difflib
import re
from pathlib import Path

from .load import Origins, expand, origin_of
from .models import Spec, _is_url
from .problems import Problem

DATA_EXTENSIONS = (".json", ".jsonl", ".parquet", ".csv", ".arrow", ".txt", ".tsv")
HUB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")


def resolve_files(spec: Spec, origins: Origins, source: Path) -> list[Problem]:
    problems: list[Problem] = []
    cwd = Path.cwd()

    def where(path: str) -> str | None:
        return origin_of(origins, tuple(path.split(".")))

    def bases(path: str) -> list[Path]:
        origin = where(path) or ""
        m = re.match(r"^(.*):\d+$", origin)
        if m:  # written in a file: relative to that file's folder first, then EasyR1's cwd
            return _unique([Path(m.group(1)).parent.resolve(), cwd])
        return _unique([cwd, source.parent.resolve()])

    def problem(path: str, message: str) -> None:
        problems.append(Problem(path, message, where(path)))

    def find(path: str, value: str, kind: str, why: str = "") -> Path | None:
        if reason := unusable_path(value):
            problem(path, reason)
            return None
        candidates = [(b / expand(value)).resolve() for b in bases(path)]
        for c in candidates:
            if c.is_file() if kind == "file" else c.is_dir():
                return c
        if kind == "file" and any(c.is_dir() for c in candidates):
            problem(path, f"{value} is a folder: give a file{why}")
            return None
        looked = (
            " or ".join(str(c) for c in candidates[:2])
            if not expand(value).is_absolute()
            else str(candidates[0])
        )
        hint = _near_name(candidates[0])
        problem(path, f"{kind} not found: {value} (looked for {looked}){hint}{why}")
        return None

    d, w, t = spec.data, spec.worker, spec.trainer
    if d.format_prompt:
        found = find(
            "data.format_prompt", d.format_prompt, "file", "; EasyR1 would silently train without the prompt"
        )
        if found:
            d.format_prompt = str(found)
            problems += _check_template(found, where("data.format_prompt"))
    if d.override_chat_template:
        found = find("data.override_chat_template", d.override_chat_template, "file")
        if found:
            d.override_chat_template = str(found)
    if d.image_dir:
        found = find("data.image_dir", d.image_dir, "folder")
        if found:
            d.image_dir = str(found)
    rf = w.reward.reward_function
    if rf and _is_url(rf) and (reason := bad_url(rf)):
        problem("worker.reward.reward_function", reason)
    if rf and not _is_url(rf):
        found = find(
            "worker.reward.reward_function", rf, "file", "; EasyR1 would silently train with no reward"
        )
        if found:
            w.reward.reward_function = str(found)
            for msg in reward_function_problems(
                found, w.reward.reward_function_name or "main", w.reward.reward_function_kwargs
            ):
                problem("worker.reward.reward_function", msg)
    if t.load_checkpoint_path and not _is_url(t.load_checkpoint_path):
        found = find("trainer.load_checkpoint_path", t.load_checkpoint_path, "folder")
        if found:
            t.load_checkpoint_path = str(found)
    for key in ("train_files", "val_files"):
        value = getattr(d, key)
        at = f"data.{key}"
        if isinstance(value, list):
            setattr(d, key, [_resolve_local_or_hub(at, v, bases(at), problem, "data") for v in value])
        elif value:
            setattr(d, key, _resolve_local_or_hub(at, value, bases(at), problem, "data"))
    for key in ("train_files", "val_files"):
        for value in getattr(d, key) if isinstance(getattr(d, key), list) else [getattr(d, key)]:
            if (
                value
                and not unusable_path(value)
                and Path(value).is_file()
                and Path(value).suffix.lower() in ROW_FILES
            ):
                message = _image_rows(Path(value), d)
                if message:
                    problem(f"data.{key}", message)
    for role in ("actor", "critic"):
        model = getattr(w, role).model
        for key in ("model_path", "tokenizer_path"):
            value = getattr(model, key)
            if value:
                at = f"worker.{role}.model.{key}"
                setattr(model, key, _resolve_local_or_hub(at, value, bases(at), problem, "model"))
    return problems


def bad_url(url: str) -> str | None:
    """Why `url` is not a usable http(s) URL (a bad port or host, another scheme), or None."""
    import urllib.parse

    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number or out of range
    except ValueError as e:
        return f"{url[:120]!r} is not a valid URL ({e}): write http(s)://HOST[:PORT]/PATH"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url[:120]!r} is not an http(s) URL with a host: write http(s)://HOST[:PORT]/PATH"
    return None


def unusable_path(value: str) -> str | None:
    """Why `value` cannot be a path on this machine (a control character, a part over 255 bytes), or None."""
    shown = repr(value if len(value) <= 80 else f"{value[:79]}…")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        return f"{shown} holds a control character: give the path as it is on disk"
    if any(len(part.encode()) > 255 for part in value.split("/")):
        return f"{shown} has a part longer than 255 bytes, more than a file name can be"
    return None


def placeholder_mismatch(where: str, row: int, wanted: int, images: int, d) -> str:
    """The one line for a row whose `<image>` placeholders and images differ (validate, data load)."""
    return (
        f"{where}: row {row} has {wanted} <image> placeholder(s) in {d.prompt_key!r} and {images} "
        f"image(s) in {d.image_key!r}; put one <image> in the prompt where each image goes"
    )


def template_placeholders(format_prompt: str | None) -> int:
    """How many `<image>` placeholders the format prompt adds around `content` (EasyR1 splits the
    prompt at them after the format prompt is applied, so a template may place the picture)."""
    if not format_prompt:
        return 0
    import jinja2

    try:
        return (
            jinja2.Template(Path(format_prompt).read_text(encoding="utf-8"))
            .render(content="")
            .count("<image>")
        )
    except (OSError, ValueError, jinja2.TemplateError):
        return 0  # the template's own check names what is wrong with it


def mixed_rows(where: str, bare: int, with_images: int) -> str:
    """The one line for a data set that mixes text-only rows with image rows (validate, data load)."""
    return (
        f"{where} mixes {bare} text-only rows with {with_images} rows with images, which is not "
        "supported yet (FSDP's workers would wait on each other's vision tower): give every row an "
        "image, or train the text rows as their own data set"
    )


ROW_FILES = (".jsonl", ".json", ".parquet")  # local files whose rows validate reads


def _rows(path: Path, columns: list[str], limit: int):
    """The first `limit` rows of a local JSON-lines, JSON-array or parquet file (parquet: only
    `columns`), as dicts; a row that is not one ends the check (the data loader names it)."""
    import json

    if path.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        f = pq.ParquetFile(path)
        have = [c for c in columns if c in f.schema_arrow.names]
        seen = 0
        for batch in f.iter_batches(batch_size=1024, columns=have):
            yield from batch.to_pylist()[: limit - seen]
            seen += batch.num_rows
            if seen >= limit:
                return
        return
    with open(path, encoding="utf-8") as f:
        if f.read(1) == "[":  # a JSON array: the data loader reads it whole too
            f.seek(0)
            yield from json.load(f)[:limit]
            return
        f.seek(0)
        for i, line in enumerate(f):
            if i >= limit:
                return
            yield json.loads(line)


def _image_rows(path: Path, d, limit: int = 20000) -> str | None:
    """The first row (of a local data file's first `limit`) whose `<image>` placeholders and images
    differ, that holds videos, or text-only rows among image rows: what the trainer would refuse
    at data load, said now."""
    bare = with_images = 0
    added = template_placeholders(d.format_prompt)
    try:
        for i, row in enumerate(_rows(path, [d.prompt_key, d.image_key, d.video_key], limit)):
            if not isinstance(row, dict):
                return None
            if row.get(d.video_key):
                return f"{path.name}: row {i} holds videos ({d.video_key!r}), which are not supported yet; give their frames as images"
            if d.image_key not in row:  # no image column: a text prompt, as EasyR1 decides
                bare += 1
                continue
            images = row[d.image_key] or []
            images = images if isinstance(images, list) else [images]
            wanted = str(row.get(d.prompt_key, "")).count("<image>") + added
            if wanted != len(images):
                return placeholder_mismatch(path.name, i, wanted, len(images), d)
            bare, with_images = bare + (not images), with_images + bool(images)
    except (ValueError, OSError, ImportError):
        return None  # not this check's business: the data loader names a broken file or row
    return mixed_rows(path.name, bare, with_images) if bare and with_images else None


def _unique(paths: list[Path]) -> list[Path]:
    return list(dict.fromkeys(paths))


def _near_name(path: Path) -> str:
    try:
        names = [p.name for p in path.parent.iterdir()] if path.parent.is_dir() else []
    except OSError:
        return ""
    close = difflib.get_close_matches(path.name, names, n=1, cutoff=0.6)
    return f"; did you mean {path.parent / close[0]}?" if close else ""


def _looks_local(value: str) -> bool:
    return (
        value.startswith((".", "/", "~"))
        or value.lower().endswith(DATA_EXTENSIONS)
        or value.count("/") >= 2
        or "\\" in value
    )


NOT_FOUND = {
    "data": (
        "not found",
        "give a local file or folder, or a Hub dataset as name@split",
        "a local file nor a Hub dataset id (org/name@split)",
    ),
    "model": (
        "folder not found",
        "give a local model folder or a Hugging Face id such as Qwen/Qwen2.5-7B-Instruct",
        "a local model folder nor a Hugging Face id (org/name)",
    ),
}


def _resolve_local_or_hub(path: str, value: str, bases: list[Path], problem, kind: str) -> str:
    """A local file or folder becomes absolute (data keeps its @split); a Hub id stays as it is."""
    if reason := unusable_path(value):
        problem(path, reason)
        return value
    name, at, split = value.rpartition("@") if kind == "data" and "@" in value else (value, "", "")
    for b in bases:
        c = (b / expand(name)).resolve()
        if c.exists():
            return f"{c}{at}{split}"
    missing, fix, neither = NOT_FOUND[kind]
    if _looks_local(name):
        problem(path, f"{missing}: {name} (looked in {', '.join(map(str, bases))}); {fix}")
    elif not HUB_ID_RE.match(name):
        problem(path, f"{value!r} is neither {neither}")
    return value


def _check_template(path: Path, origin: str | None) -> list[Problem]:
    import jinja2
    import jinja2.meta

    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        return [Problem("data.format_prompt", f"cannot read {path}: {e.strerror}", origin)]
    try:
        parsed = jinja2.Environment().parse(text.strip())
    except jinja2.TemplateSyntaxError as e:
        return [
            Problem(
                "data.format_prompt", f"{path}:{e.lineno}: not a valid Jinja template: {e.message}", origin
            )
        ]
    if "content" not in jinja2.meta.find_undeclared_variables(parsed):
        return [
            Problem(
                "data.format_prompt",
                f"{path} never uses {{{{ content }}}}: every prompt would be the same text",
                origin,
                warning=True,
            )
        ]
    return []


def reward_function_problems(path: Path, fn_name: str, kwargs: dict) -> list[str]:
    """What would make EasyR1's loader fail on `path:fn_name`, found without running the file."""
    if path.suffix != ".py":
        return [f"{path} is not a Python file: give file.py:function"]
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"), filename=str(path))
    except SyntaxError as e:
        return [f"{path}:{e.lineno}: Python syntax error: {e.msg}"]
    except (OSError, ValueError) as e:
        return [f"cannot read {path}: {getattr(e, 'strerror', None) or e}"]
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    bound = set(functions) | _other_bindings(tree)
    problems = []
    reward_type = _string_constant(tree, "REWARD_TYPE")
    if reward_type is not None and reward_type not in ("batch", "sequential"):
        problems.append(f"{path}: REWARD_TYPE is {reward_type!r}; use 'batch' or 'sequential'")
    if fn_name not in bound:
        close = difflib.get_close_matches(fn_name, sorted(functions), n=1)
        have = (
            f"; did you mean {close[0]}?"
            if close
            else (
                f"; it defines {', '.join(sorted(functions))}" if functions else "; it defines no functions"
            )
        )
        return [*problems, f"{path} has no function {fn_name!r}{have} (write file.py:function)"]
    fn = functions.get(fn_name)
    if fn is None:
        return problems  # bound by import or assignment: its signature is checked when loaded
    if isinstance(fn, ast.AsyncFunctionDef):
        problems.append(f"{fn_name} is async; EasyR1's interface calls a plain function")
    args = fn.args
    positional = [a.arg for a in (*args.posonlyargs, *args.args)]
    if not positional and args.vararg is None:
        return [
            *problems,
            f"{fn_name}({_sig(fn)}) takes no argument; EasyR1 calls it with the reward inputs (a list of dicts, or one dict when sequential)",
        ]
    defaults_from = len(positional) - len(args.defaults)
    required = [p for i, p in enumerate(positional) if i >= 1 and i < defaults_from]
    required += [a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None]
    accepted = set(positional[1:]) | {a.arg for a in args.kwonlyargs}
    missing = [r for r in required if r not in kwargs]
    if missing:
        example = ", ".join(f'"{m}": ...' for m in missing)
        problems.append(
            f"{fn_name} needs {', '.join(missing)}: set worker.reward.reward_function_kwargs='{{{example}}}'"
        )
    unknown = [k for k in kwargs if k not in accepted]
    if unknown and args.kwarg is None:
        problems.append(
            f"{fn_name}({_sig(fn)}) does not accept {', '.join(unknown)} from worker.reward.reward_function_kwargs"
        )
    return problems


def _sig(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    return ast.unparse(fn.args)


def _other_bindings(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign | ast.AugAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
    return names


def _string_constant(tree: ast.Module, name: str) -> str | None:
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return node.value.value
    return None
