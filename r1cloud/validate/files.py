"""Files a blueprint names: found (relative to the blueprint's folder, then the working directory,
as EasyR1 resolves them), made absolute in the resolved spec, and checked — where EasyR1 silently
turns a missing prompt or reward file into None, r1cloud stops with the path it looked for.

The reward function is checked by reading its source (ast), never by importing it: validation
must not run user code or pull in its imports. Tools are imported, in a child process of their own
(their schemas come from the live functions).
"""

from __future__ import annotations

import ast
import difflib
import itertools
import os
import re
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from r1cloud.agents.tools import ENV, TOOLS
from r1cloud.agents.tools import check as check_tools
from r1cloud.core.families import VIDEO_FAMILIES, model_config, model_context, text_config, unsupported
from r1cloud.core.paths import expand
from r1cloud.core.records import cut, load_object
from r1cloud.data import prompts
from r1cloud.spec.load import Origins, origin_of
from r1cloud.spec.models import Spec, _is_url
from r1cloud.spec.problems import Problem
from r1cloud.validate import data_check, imports
from r1cloud.validate.summary import batches_per_epoch

DATA_EXTENSIONS = (".json", ".jsonl", ".parquet", ".csv", ".arrow", ".txt", ".tsv")
LOOP = "{} is a symlink loop (a link that leads back to itself): give the {} itself"
# the Hub: 96 characters a part at most
HUB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}(/[A-Za-z0-9][A-Za-z0-9_.-]{0,95})?$")


def resolve_files(spec: Spec, origins: Origins, source: Path) -> list[Problem]:
    problems: list[Problem] = []
    cwd = Path.cwd()

    def where(path: str) -> str | None:
        return origin_of(origins, tuple(path.split(".")))

    def bases(path: str) -> list[Path]:
        # written in a file: relative to that file's folder first, then EasyR1's cwd
        if m := re.match(r"^(.*):\d+$", where(path) or ""):
            return list(dict.fromkeys([Path(m.group(1)).parent.resolve(), cwd]))
        return list(dict.fromkeys([cwd, source.parent.resolve()]))

    def problem(path: str, message: str, warning: bool = False) -> None:
        problems.append(Problem(path, message, where(path), warning=warning))

    def find(path: str, value: str, kind: str, why: str = "") -> Path | None:
        if reason := unusable_path(value):
            problem(path, reason)
            return None
        try:
            candidates = [(b / expand(value)).resolve() for b in bases(path)]
        except RuntimeError:  # Python's word for a symlink loop
            problem(path, LOOP.format(value, kind))
            return None
        for c in candidates:
            if c.is_file() if kind == "file" else c.is_dir():
                return c
        if kind == "file" and any(c.is_dir() for c in candidates):
            problem(path, f"{value} is a folder: give a file{why}")
            return None
        looked = " or ".join(map(str, candidates[:1] if expand(value).is_absolute() else candidates[:2]))
        hint = _near_name(candidates[0])
        problem(path, f"{kind} not found: {value} (looked for {looked}){hint}{why}")
        return None

    def resolve(owner, at: str, kind: str, why: str = "") -> Path | None:
        """The file or folder at key `at` (an attribute of `owner`) found, and made absolute."""
        key = at.rpartition(".")[2]
        found = find(at, getattr(owner, key), kind, why)
        if found:
            setattr(owner, key, str(found))
        return found

    d, w, t = spec.data, spec.worker, spec.trainer
    at, why = "data.format_prompt", "; EasyR1 would silently train without the prompt"
    if d.format_prompt and (found := resolve(d, at, "file", why)) and (unused := _template_unused(found)):
        problem(at, unused, warning=True)
    if d.override_chat_template:
        resolve(d, "data.override_chat_template", "file")
    if d.image_dir:
        resolve(d, "data.image_dir", "folder")
    rf, reward_file = w.reward.reward_function, None
    at, why = "worker.reward.reward_function", "; EasyR1 would silently train with no reward"
    if rf and _is_url(rf) and (reason := bad_url(rf)):
        problem(at, reason)
    elif rf and not _is_url(rf) and (found := resolve(w.reward, at, "file", why)):
        bad = reward_function_problems(
            found, w.reward.reward_function_name or "main", w.reward.reward_function_kwargs
        )
        for msg in bad:
            problem(at, msg)
        reward_file = None if bad else found  # imported below, once every file is found
    if t.load_checkpoint_path and not _is_url(t.load_checkpoint_path):
        resolve(t, "trainer.load_checkpoint_path", "folder")
    hub = [(d, f"data.{key}", "data") for key in ("train_files", "val_files")]
    for role, key in itertools.product(("actor", "critic"), ("model_path", "tokenizer_path")):
        hub.append((getattr(w, role).model, f"worker.{role}.model.{key}", "model"))
    for owner, at, kind in hub:  # a data mixture: each of its sets
        key = at.rpartition(".")[2]
        value = getattr(owner, key)
        if isinstance(value, list):
            setattr(owner, key, [_resolve_local_or_hub(at, v, bases(at), problem, kind) for v in value])
        elif value:
            setattr(owner, key, _resolve_local_or_hub(at, value, bases(at), problem, kind))
    # the user's Python files imported in a child process, as the job's machines would import them
    extras = ("train", *(x for x in ("wandb", "swanlab", "mlflow") if x in t.logger))

    def importable(file) -> str | None:  # the job folder once the agent's files are found too
        folder = None if spec.resources.infra == "local" else job_folder(spec.model_dump(mode="json"), source)
        return imports.problem(file, folder, extras)

    if w.rollout.multi_turn.enable:
        check_agent(spec, find, problem, importable)
    if reward_file and (msg := importable(reward_file)):
        problem("worker.reward.reward_function", msg)
    config = model_config(spec.worker.actor.model.model_path)
    text_model = config is not None and "vision_config" not in config
    family = (config or {}).get("model_type", "")
    no_videos = ("multi-turn episodes take no videos yet" if w.rollout.multi_turn.enable else
                 f"the model's family ({family}) takes no videos" if config and not text_model
                 and family not in VIDEO_FAMILIES else None)  # fmt: skip
    for at, message in [*check_data(d, text_model, limit_images=w.rollout.limit_images, no_videos=no_videos),
                        *check_model(spec, config)]:  # fmt: skip
        problem(at, message)
    return problems


def check_agent(spec: Spec, find, problem, importable) -> None:
    """The tools and environment files found, imported in a child process (`importable(file)`:
    why one would not import where the job runs), and what cannot work with the environment's
    shape; the reward rule (summary.py prints it)."""
    mt, rf = spec.worker.rollout.multi_turn, spec.worker.reward.reward_function
    tools = mt.tools and find(TOOLS, mt.tools, "file")
    env, cls = None, None
    if mt.environment and ":" in mt.environment:
        path, _, cls = mt.environment.rpartition(":")
        env = (found := find(ENV, path, "file")) and f"{found}:{cls}"
    if (mt.tools and not tools) or (mt.environment and not env):
        return  # not found: said already
    mt.tools, mt.environment = str(tools) if tools else None, env
    for at, file in ((TOOLS, tools), (ENV, env and env.rpartition(":")[0])):
        if file and (msg := importable(file)):
            problem(at, msg)
            return
    try:
        info = check_tools(env, mt.tools, mt.tool_names)
    except ValueError as e:
        at = next((k for k in (ENV, TOOLS) if str(e).startswith(f"{k}: ")), ENV if env else TOOLS)
        problem(at, str(e).removeprefix(f"{at}: "))
        return
    explicit = mt.model_dump(exclude_defaults=True)
    if info["shape"] == "gym":
        for key in ("tools", "tool_call_format"):
            if key in explicit:
                problem(
                    f"worker.rollout.multi_turn.{key}",
                    f"has no effect with {cls}, a gym-shaped environment (its step() takes the model's whole "
                    "turn): remove it, or give the environment TRL's shape (methods as tools)",
                )
    if not rf and not info.get("reward"):
        problem(
            "worker.reward.reward_function",
            f"is not set, and {cls} gives no reward (no get_reward() method): give a reward function, "
            "or add get_reward() to the environment",
        )


def local_paths(value) -> list[str]:
    """Every absolute path in the resolved spec that exists on this machine (files the blueprint
    names: data, prompts, reward functions, local models)."""
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return [p for v in value for p in local_paths(v)]
    return [value] if isinstance(value, str) and value.startswith("/") and os.path.exists(value) else []


def job_folder(spec_data: dict, blueprint: Path) -> Path:
    """The folder a cloud job uploads (its workdir): the blueprint's, widened to hold every local
    file the spec (as a dict) names (sky_task.workdir_for also refuses one too wide)."""
    return Path(os.path.commonpath([str(blueprint.resolve().parent), *local_paths(spec_data)]))


def vocabulary(folder: str | None) -> dict | None:
    """A local tokenizer's token -> id map (tokenizer.json's model vocabulary and added tokens),
    or None where there is none to read (a Hub id, a slow tokenizer without one)."""
    try:
        tok = load_object(Path(folder) / "tokenizer.json") if folder else None
        if tok is None:
            return None
        vocab = tok["model"]["vocab"]
        vocab = dict(vocab) if isinstance(vocab, dict) else {p: i for i, (p, _) in enumerate(vocab)}
        return vocab | {t["content"]: t["id"] for t in tok.get("added_tokens") or []}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_model(spec: Spec, config: dict | None) -> Iterator[tuple[str, str]]:
    """A local model_path that is not a model folder, and with its config.json at hand: prompt +
    response beyond the model's context (vLLM would stop at start-up), or the language model frozen
    in a text-only model."""
    at = "worker.actor.model.model_path"
    path = spec.worker.actor.model.model_path
    if not path or unusable_path(path) or not Path(path).exists():
        return  # a Hub id, or said already
    if config is None:  # the folder's config.json, read by model_config
        if not Path(path).is_dir():
            why = " is a file: give the model's folder (the one holding config.json)"
        elif not (Path(path) / "config.json").exists():
            why = " has no config.json: give a Hugging Face model folder (as save_pretrained writes)"
        else:
            why = "/config.json cannot be read as a JSON object: restore it from the model's source"
        yield at, f"{path}{why}"
        return
    if reason := unsupported(config):
        yield at, f"{path}: {reason}; train a model of a supported family"
    context = model_context(config)
    d, r = spec.data, spec.worker.rollout
    need = r.max_model_len or d.max_prompt_length + d.max_response_length
    if context is not None and context < need:
        key = "worker.rollout.max_model_len" if r.max_model_len else "data.max_response_length"
        what = key if r.max_model_len else "data.max_prompt_length + max_response_length"
        yield (
            key,
            f"{what} ({need}) is more than the model's context ({context} tokens, max_position_embeddings "
            f"in {path}/config.json): lower them to fit",
        )
    critic, actor = spec.worker.critic.model, spec.worker.actor.model
    if spec.algorithm.estimator.critic and critic.tokenizer_path not in (None, actor.tokenizer_path):
        mine, theirs = vocabulary(critic.tokenizer_path), vocabulary(actor.tokenizer_path or path)
        if mine is not None and theirs is not None and mine != theirs:
            yield (
                "worker.critic.model.tokenizer_path",
                f"{critic.tokenizer_path} maps tokens to ids unlike the actor's tokenizer ({len(mine)} vs "
                f"{len(theirs)} tokens): the critic scores the actor's token ids; give it the actor's tokenizer",
            )
    heads = text_config(config).get("num_attention_heads")
    for key, size in ((f"worker.{r}.ulysses_size", getattr(spec.worker, r).ulysses_size) for r in spec.roles):
        if size > 1 and isinstance(heads, int) and heads % size:
            yield (
                key,
                f"{size} does not divide the model's {heads} attention heads (num_attention_heads in "
                f"{path}/config.json), which Ulysses splits across its group: use a divisor of {heads}",
            )
    if spec.worker.actor.model.freeze_language_model and "vision_config" not in config:
        yield (
            "worker.actor.model.freeze_language_model",
            f"the model in {path} is text-only (no vision_config): freezing its language model "
            "leaves nothing to train; remove it",
        )


def bad_url(url: str) -> str | None:
    """Why `url` is not a usable http(s) URL (a bad port or host, another scheme), or None."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number or out of range
        if any(c.isspace() or ord(c) < 32 for c in url):
            raise ValueError("it holds a space or a control character")
    except ValueError as e:
        return f"{url[:120]!r} is not a valid URL ({e}): write http(s)://HOST[:PORT]/PATH"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url[:120]!r} is not an http(s) URL with a host: write http(s)://HOST[:PORT]/PATH"
    return None


def unusable_path(value: str) -> str | None:
    """Why `value` cannot be a path on this machine (a control character, a part over 255 bytes), or None."""
    shown = repr(cut(value, 80))
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        return f"{shown} holds a control character: give the path as it is on disk"
    if any(len(part.encode()) > 255 for part in value.split("/")):
        return f"{shown} has a part longer than 255 bytes, more than a file name can be"
    return None


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
        try:
            c = (b / expand(name)).resolve()
        except RuntimeError:  # a symlink loop
            problem(path, LOOP.format(name, kind))
            return value
        if c.exists():
            return f"{c}{at}{split}"
    missing, fix, neither = NOT_FOUND[kind]
    if _looks_local(name):
        problem(path, f"{missing}: {name} (looked in {', '.join(map(str, bases))}); {fix}")
    elif not HUB_ID_RE.match(name):
        problem(path, f"{value!r} is neither {neither}")
    return value


def _template_unused(path: Path) -> str | None:
    """A template that never uses `content` (said as a warning); whether it renders is check_data's."""
    import jinja2
    import jinja2.meta

    try:
        parsed = jinja2.Environment().parse(path.read_text(encoding="utf-8", errors="replace").strip())
        used = jinja2.meta.find_undeclared_variables(parsed)
    except (OSError, jinja2.TemplateError):
        return None
    if "content" not in used:
        return f"{path} never uses {{{{ content }}}}: every prompt would be the same text"
    return None


def check_data(
    d,
    text_model: bool = False,
    keys=("train_files", "val_files"),
    limit_images: int = 0,
    no_videos: str | None = None,
) -> list[tuple[str, str]]:
    """(key, message) for each local data file's problems (data_check.py), the format prompt
    rendered over the first real row, and a train set smaller than one rollout batch."""
    found: list[tuple[str, str]] = []
    first: str | None = None
    usable = d.format_prompt and not unusable_path(d.format_prompt) and Path(d.format_prompt).is_file()
    template = d.format_prompt if usable else None
    added = prompts.placeholders(template)  # `<image>` the template adds to every prompt
    for key in keys:
        values = getattr(d, key)
        for value in values if isinstance(values, list) else [values]:
            if not value or unusable_path(value):
                continue
            try:
                files = data_check.local_files(value) or []
            except data_check.DataError as e:
                found.append((f"data.{key}", str(e)))
                continue
            for file in files:
                messages, prompt = data_check.check_file(file, d, added, text_model, limit_images, no_videos)
                first = prompt if first is None else first
                found += [(f"data.{key}", m) for m in messages]
    sample = first if first is not None else "What is 1 + 1?"
    if template and (message := prompts.check(template, sample)):
        found.append(("data.format_prompt", f"{template}: {message}"))
    rows = data_check.count_rows(d.train_files) if "train_files" in keys else None
    if rows is not None and batches_per_epoch(rows, d) == 0 and not found:
        found.append(
            (
                "data.train_files",
                f"holds {rows} rows, fewer than one rollout batch (data.rollout_batch_size "
                f"{d.rollout_batch_size}): the run would train nothing; lower data.rollout_batch_size to "
                f"at most {rows}, or give more rows",
            )
        )
    return found


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
        defines = f"; it defines {', '.join(sorted(functions))}" if functions else "; it defines no functions"
        have = f"; did you mean {close[0]}?" if close else defines
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
            f"{fn_name}({ast.unparse(fn.args)}) takes no argument; EasyR1 calls it with the reward inputs (a list of dicts, or one dict when sequential)",
        ]
    required = positional[1 : len(positional) - len(args.defaults)]  # after the inputs, before the defaults
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
            f"{fn_name}({ast.unparse(fn.args)}) does not accept {', '.join(unknown)} from worker.reward.reward_function_kwargs"
        )
    return problems


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
