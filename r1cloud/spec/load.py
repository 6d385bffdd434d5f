"""Reading a blueprint: YAML with line numbers, EasyR1's `config=base.yaml` and `a.b.c=value`
overrides, v0.3.2 legacy keys, resources kept in step with the trainer's device counts, and schema
errors turned into readable problems.

Precedence is EasyR1's: defaults < `config=` base < the blueprint < dotted overrides. Values are
YAML-typed (`true`, `1.0e-6`, `['a','b']`, `{"n": 16}`), as OmegaConf's dotlist parses them. We
parse ourselves rather than through OmegaConf because we need every key's file and line, and every
problem at once, where OmegaConf's struct merge stops at the first.
"""

from __future__ import annotations

import copy
import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

from r1cloud.core.accelerators import accelerator_options
from r1cloud.core.records import cut
from r1cloud.spec.models import Spec
from r1cloud.spec.numbers import MAX_DIGITS, long_number
from r1cloud.spec.problems import Problem

Key = tuple[str, ...]
Origins = dict[Key, str]  # key path -> "file.yaml:LINE" or "command line"
CLI = "command line"
OVERRIDE_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z_][A-Za-z0-9_-]*)*)=(.*)$", re.S)

# Names users bring from verl / older EasyR1: suggestions only, never silent renames.
ALIASES = {
    "train_batch_size": "data.rollout_batch_size",
    "gen_batch_size": "data.mini_rollout_batch_size",
    "ppo_mini_batch_size": "worker.actor.global_batch_size",
    "ppo_micro_batch_size_per_gpu": "worker.actor.micro_batch_size_per_device_for_update",
    "log_prob_micro_batch_size_per_gpu": "worker.actor.micro_batch_size_per_device_for_experience",
    "ulysses_sequence_parallel_size": "worker.actor.ulysses_size",
    "total_episodes": "trainer.total_epochs",
    "total_training_steps": "trainer.max_steps",
    "score_function": "worker.reward.reward_function",
    "reward_fn": "worker.reward.reward_function",
    "path": "worker.actor.model.model_path",
    "kl_loss_coef": "algorithm.kl_coef",
    "lora_rank": "worker.actor.model.lora.rank",
    "lora_alpha": "worker.actor.model.lora.alpha",
    "target_modules": "worker.actor.model.lora.target_modules",
    "exclude_modules": "worker.actor.model.lora.exclude_modules",
    "kl_loss_type": "algorithm.kl_penalty",
    "entropy_coeff": "worker.actor (no entropy bonus key in EasyR1)",
}


@dataclass
class Loaded:
    spec: Spec
    warnings: list[Problem]
    origins: Origins = field(default_factory=dict)
    source: Path | None = None


# --------------------------------------------------------------------------- YAML with lines
def display_path(path: Path) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return str(path)
    return str(path) if rel.startswith("..") else rel


def read_yaml(path: Path) -> tuple[dict, Origins, list[Problem]]:
    """The mapping in `path`, each key's `file:line`, and what is wrong with the file itself."""
    shown = display_path(path)
    try:
        if not path.is_file():
            what = "is a directory" if path.is_dir() else "does not exist"
            return {}, {}, [Problem("", f"{shown} {what}: give the path of a blueprint YAML file")]
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, ValueError) as e:  # a name too long, a NUL in it, unreadable
        reason = getattr(e, "strerror", None) or str(e)
        return {}, {}, [Problem("", f"cannot read {cut(shown)}: {reason}")]
    node = None
    try:  # the reader refuses NUL and control characters; the node tree gives each key's line
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
        origins: Origins = {}
        problems: list[Problem] = []
        _walk(node, (), shown, origins, problems, set())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{shown}:{mark.line + 1}" if mark else shown
        reason = getattr(e, "problem", None) or str(e).splitlines()[0]
        return {}, {}, [Problem("", f"not valid YAML: {reason}", where)]
    except RecursionError:
        deep = "nested too deeply to read (hundreds of levels): a blueprint is a few levels deep"
        return {}, {}, [Problem("", deep, shown)]
    except ValueError as e:  # a number of thousands of digits (Python's int conversion limit), …
        key, line = long_number(node)  # the tree composed: the number is read when constructed
        if key is not None:
            message = f"a number of more than {MAX_DIGITS:,} digits is no setting's value"
            return {}, {}, [Problem(key, message, f"{shown}:{line}")]
        return {}, {}, [Problem("", f"not valid YAML: {cut(str(e).split(';')[0])}", shown)]
    if data is None:
        data = {}
    if not isinstance(data, dict):
        message = f"a blueprint is a mapping of keys (data:, worker:, …), not a {type(data).__name__}"
        return {}, {}, [Problem("", message, shown)]
    _drop_non_string_keys(data, (), origins, problems, set())
    return data, origins, problems


def _drop_non_string_keys(
    tree: dict, prefix: Key, origins: Origins, problems: list[Problem], seen: set
) -> None:
    """YAML reads `true:` or `1:` as a boolean or number key, which no setting is: said, and dropped.
    A mapping reached again through an alias is not walked again (`seen`): aliases of aliases would
    make that exponential."""
    if id(tree) in seen:
        return
    seen.add(id(tree))
    for key in list(tree):
        if not isinstance(key, str):
            raw = next(
                (k[-1] for k in origins if k[:-1] == prefix and k[-1].lower() == str(key).lower()), str(key)
            )
            where = origins.get((*prefix, raw))
            kind = "a boolean" if isinstance(key, bool) else f"a {type(key).__name__}"
            problems.append(
                Problem(".".join((*prefix, raw)), f"YAML reads this key as {kind}, not a name", where)
            )
            del tree[key]
        elif isinstance(tree[key], dict):
            _drop_non_string_keys(tree[key], (*prefix, key), origins, problems, seen)


def _walk(node: Any, prefix: Key, shown: str, origins: Origins, problems: list[Problem], walked: set) -> None:
    """Each key's `file:line`, and keys written twice. A mapping reached again through an alias is
    walked once (`walked`): its keys' lines are where the anchor is written."""
    if not isinstance(node, yaml.MappingNode) or id(node) in walked:
        return
    walked.add(id(node))
    seen: set[str] = set()
    for knode, vnode in node.value:
        key = str(knode.value)
        path = (*prefix, key)
        where = f"{shown}:{knode.start_mark.line + 1}"
        # a key merged in (`<<: *anchor`) is written elsewhere: overriding it here is YAML's intent
        written_here = node.start_mark.index <= knode.start_mark.index <= node.end_mark.index
        if key in seen and written_here:
            problems.append(
                Problem(".".join(path), "is written twice; YAML would silently keep the last one", where)
            )
        if written_here:
            seen.add(key)
        origins[path] = where
        _walk(vnode, path, shown, origins, problems, walked)


# --------------------------------------------------------------------------- overrides
def parse_override(text: str) -> tuple[Key, Any]:
    """`a.b.c=value` -> (("a","b","c"), YAML-typed value). Raises ValueError with the fix."""
    m = OVERRIDE_RE.match(text.strip())
    if not m:
        raise ValueError(
            f"{cut(repr(text), 80)} is not an override: write key.path=value, e.g. worker.rollout.n=8"
        )
    raw = m.group(2)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw  # like OmegaConf: an unparsable value stays a string; the schema judges it
    except RecursionError:
        raise ValueError(f"{m.group(1)}: the value is nested too deeply (hundreds of levels)") from None
    except ValueError:  # Python's limit on an integer's digits
        raise ValueError(
            f"{m.group(1)}: a number of more than {MAX_DIGITS:,} digits is no setting's value"
        ) from None
    return tuple(m.group(1).split(".")), value


def set_path(tree: dict, key: Key, value: Any) -> None:
    node = tree
    for part in key[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[key[-1]] = value


def get_path(tree: Any, key: Key, default: Any = None) -> Any:
    for part in key:
        if not isinstance(tree, dict) or part not in tree:
            return default
        tree = tree[part]
    return tree


def del_path(tree: dict, key: Key) -> None:
    for i in range(len(key), 0, -1):  # the deepest prefix that exists
        parent = get_path(tree, key[: i - 1])
        if isinstance(parent, dict) and key[i - 1] in parent:
            del parent[key[i - 1]]
            return


def deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        both = isinstance(v, dict) and isinstance(out.get(k), dict)
        out[k] = deep_merge(out[k], v) if both else copy.deepcopy(v)
    return out


# --------------------------------------------------------------------------- legacy keys
def apply_legacy(raw: dict, origins: Origins) -> list[Problem]:
    warnings = []
    for role in ("actor", "critic"):
        optim = get_path(raw, ("worker", role, "optim"))
        if isinstance(optim, dict) and "warmup_style" in optim:
            old = ("worker", role, "optim", "warmup_style")
            new = ("worker", role, "optim", "lr_scheduler_type")
            value = optim.pop("warmup_style")
            optim.setdefault("lr_scheduler_type", value)
            origins.setdefault(new, origins.get(old, CLI))
            message = f"is deprecated (EasyR1 v0.3.2); write {'.'.join(new)} instead"
            warnings.append(Problem(".".join(old), message, origins.get(old), warning=True))
    key = ("worker", "reward", "reward_type")
    if get_path(raw, key) is not None:
        message = (
            "is deprecated (EasyR1 v0.3.2); set REWARD_TYPE in the reward module instead (still honoured)"
        )
        warnings.append(Problem(".".join(key), message, origins.get(key), warning=True))
    return warnings


# --------------------------------------------------------------------------- resources <-> trainer
def sync_resources(raw: dict, origins: Origins) -> list[Problem]:
    """Setting the accelerator count or node count sets the trainer's, and the other way round."""
    problems = []
    res, tr = raw.setdefault("resources", {}), raw.setdefault("trainer", {})
    if not isinstance(res, dict) or not isinstance(tr, dict):
        return problems  # the schema reports the wrong type
    pairs = [(("resources", "num_nodes"), ("trainer", "nnodes"), res.get("num_nodes"))]
    accels = res.get("accelerators")
    if accels is not None:
        try:
            counts = {c for _, c in accelerator_options(accels)}
        except (ValueError, TypeError, AttributeError):
            counts = set()  # the schema reports it
        if len(counts) == 1:
            pairs.append((("resources", "accelerators"), ("trainer", "n_gpus_per_node"), counts.pop()))
    for rkey, tkey, rvalue in pairs:
        tvalue = get_path(raw, tkey)
        if rvalue is None:
            if tvalue is not None and rkey[1] == "num_nodes":
                res["num_nodes"] = tvalue
                origins.setdefault(rkey, origins.get(tkey, CLI))
            continue
        if tvalue is None:
            tr[tkey[1]] = rvalue
            origins.setdefault(tkey, origins.get(rkey, CLI))
        elif tvalue != rvalue:
            message = (
                f"means {rvalue} per {'node' if rkey[1] == 'accelerators' else 'job'}, but {'.'.join(tkey)} is "
                f"{tvalue} ({origins.get(tkey, 'default')}): set one of them, or make them equal"
            )
            problems.append(Problem(".".join(rkey), message, origins.get(rkey), related=(".".join(tkey),)))
    return problems


# --------------------------------------------------------------------------- schema errors
def _model_at(loc: Key) -> type[BaseModel] | None:
    model = Spec
    for part in loc:
        if model is None or part not in model.model_fields:
            return None
        model = _nested_model(model.model_fields[part].annotation)
    return model


def _nested_model(annotation: Any) -> Any:
    for arg in (annotation, *get_args(annotation)):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def field_at(key: Key):
    """The schema's field (pydantic's FieldInfo) at a key path."""
    return _model_at(key[:-1]).model_fields[key[-1]]


def all_keys(model: type[BaseModel] = Spec, prefix: Key = ()) -> list[Key]:
    keys = []
    for name, f in model.model_fields.items():
        keys.append((*prefix, name))
        sub = _nested_model(f.annotation)
        if sub is not None:
            keys.extend(all_keys(sub, (*prefix, name)))
    return keys


def suggest_key(loc: Key) -> str | None:
    parent, name = loc[:-1], loc[-1]
    if name in ALIASES:  # known names from verl / older EasyR1 beat a fuzzy match
        return ALIASES[name]
    model = _model_at(parent)
    siblings = list(model.model_fields) if model else []
    close = difflib.get_close_matches(name, siblings, n=1, cutoff=0.75)
    if close:
        return ".".join((*parent, close[0]))
    everywhere = [k for k in all_keys() if k[-1] == name]
    if not everywhere:
        leaves = {k[-1]: k for k in all_keys()}
        near = difflib.get_close_matches(name, list(leaves), n=1, cutoff=0.8)
        everywhere = [leaves[near[0]]] if near else []
    if everywhere:
        return ".".join(everywhere[0])
    close = difflib.get_close_matches(name, siblings, n=1, cutoff=0.5)
    return ".".join((*parent, close[0])) if close else None


def origin_of(origins: Origins, loc: Key) -> str | None:
    for i in range(len(loc), 0, -1):
        if loc[:i] in origins:
            return origins[loc[:i]]
    return None


def schema_problem(err: dict, origins: Origins) -> tuple[Key, Problem]:
    loc = tuple(str(p) for p in err["loc"])
    key_loc = tuple(p for p in loc if not p.isdigit())
    path = ".".join(p if re.fullmatch(r"[\w.-]+", p) else repr(p) for p in loc)
    where = origin_of(origins, loc)
    kind, value = err["type"], err.get("input")
    if kind == "extra_forbidden":
        hint = suggest_key(loc)
        known = (
            "an EasyR1/r1cloud key"
            if len(loc) > 1
            else "a top-level key (data, algorithm, worker, trainer, name, resources, envs, secrets)"
        )
        msg = f"unknown key: not {known}" + (f"; did you mean {hint}?" if hint else "")
        return key_loc, Problem(path, msg, where)
    msg = err["msg"].removeprefix("Value error, ")
    if kind == "literal_error":
        allowed = re.findall(r"'([^']*)'", err.get("ctx", {}).get("expected", ""))
        close = difflib.get_close_matches(str(value), allowed, n=1, cutoff=0.6)
        msg = f"{_show(value)} is not allowed; use one of: {', '.join(allowed)}" + (
            f" (did you mean {close[0]!r}?)" if close else ""
        )
    elif kind == "missing":
        msg = "is required"
    elif kind.startswith(("greater_than", "less_than")) or kind.endswith(("_type", "_parsing")):
        msg = f"{_show(value)} is not valid: {msg[0].lower()}{msg[1:]}"
    return key_loc, Problem(path, msg, where)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def fill_empty_sections(tree: dict) -> None:
    """`worker:` with everything under it commented out is an empty section, not null."""
    for key in all_keys():  # a section before its keys
        parent = get_path(tree, key[:-1])
        if isinstance(parent, dict) and key[-1] in parent and parent[key[-1]] is None and _model_at(key):
            parent[key[-1]] = {}


def validate_tree(raw: dict, origins: Origins) -> tuple[Spec | None, list[Problem], set[Key]]:
    """Validate; on errors, drop the bad keys and retry, so later checks can still run."""
    problems: list[Problem] = []
    bad: set[Key] = set()
    tree = copy.deepcopy(raw)
    for _ in range(5):
        try:
            return Spec.model_validate(tree), problems, bad
        except ValidationError as e:
            for err in e.errors():
                key, problem = schema_problem(err, origins)
                if key not in bad:
                    problems.append(problem)
                    bad.add(key)
                del_path(tree, key if key else ("name",))
    return None, problems, bad
