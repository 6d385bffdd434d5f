"""Serving a model locally behind an OpenAI-compatible API: which model (a job's checkpoint, merged
first when it is not INFERENCE READY; a Hugging Face folder; a Hub id), which engine (vLLM's
server when vLLM is installed, else r1cloud's small transformers server), the command that runs it,
and the wait until `/v1/models` answers. Light imports only: the CLI calls this at start-up.

The API key never appears on a command line or in job.json: it reaches the server through its
environment (VLLM_API_KEY for vLLM, R1CLOUD_API_KEY for the fallback).
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import json
import math
import os
import random
import re
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from r1cloud.agents.tools import tool_schemas
from r1cloud.checkpoint.store import base_model, job_checkpoint_root, locate, parse_ref, select
from r1cloud.core.families import VIDEO_FAMILIES, kv_bytes_per_token, model_config, text_config
from r1cloud.core.jobstore import JobStore, home
from r1cloud.core.paths import is_dir
from r1cloud.core.records import load_object
from r1cloud.rollout.engine import vllm_max_rank
from r1cloud.spec import load_resolved

# org/name, 96 characters each at most
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")


class ServeError(Exception):
    """A problem the user can fix; args: (title, [hint lines]), as checkpoint.store's NotFound,
    which resolving a checkpoint raises too."""


@dataclass
class Model:
    path: str  # a local folder or a Hub id, as the engine loads it
    name: str  # the default served model name
    origin: str  # what it is, for the user
    adapter: str | None = None  # a LoRA adapter folder served on top of `path` (the base)
    adapter_rank: int = 0


def is_hf_folder(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def _lookup(target: str):
    """`target` -> a Model (a model folder or a Hub id, used as it is) or the checkpoint it names
    with the model's default name: (Checkpoint, name)."""
    ref, step = parse_ref(target)
    path = Path(ref)
    if step is None and is_dir(path) and is_hf_folder(path):
        return Model(str(path.resolve()), path.resolve().name, f"the model folder {path}")
    store = JobStore()
    found = locate(ref, step)
    if found:
        root, label, step = found
        name_base = Path(root).parent.name if Path(root).name == "checkpoints" else Path(root).name
    elif store.has(ref):
        root, label = job_checkpoint_root(store.path(ref)), ref
        name_base = ref
    elif HUB_ID.match(ref) and step is None:
        if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes") and not _cached(ref):
            raise ServeError(
                f"error: {ref!r} is no job or folder here, and the Hub is off (HF_HUB_OFFLINE) with no copy of it cached",
                ["give a job (`r1cloud jobs`), a checkpoint or model folder, or unset HF_HUB_OFFLINE"],
            )
        return Model(ref, ref, f"the Hugging Face Hub model {ref}")
    else:
        raise ServeError(
            f"error: {target!r} is not a job, a folder or a Hub model id",
            ["give a job (`r1cloud jobs`), JOB:step-N, a checkpoint or model folder, or org/name"],
        )
    chosen = select(root, label, step)
    return chosen, f"{name_base}-step-{chosen.step}"


def _cached(repo: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo, "config.json"), str)
    except Exception:  # an id the client refuses, or no client: not cached
        return False


def resolve(target: str, merge_fn: Callable) -> Model:
    """`target` -> a model an engine here can load. `merge_fn(checkpoint, out)` merges a checkpoint
    that is not INFERENCE READY (into its own huggingface/ folder when `out` is None; a bucket's
    into R1CLOUD_HOME/models)."""
    found = _lookup(target)
    if isinstance(found, Model):
        return found
    chosen, name = found
    if "://" in chosen.path:  # engines load local folders: merge (or copy) the bucket's model here
        out = home() / "models" / re.sub(r"[^\w.-]+", "_", chosen.path.split("://", 1)[1])
        if not is_hf_folder(out):
            merge_fn(chosen, out)
        return Model(str(out), name, f"{chosen.id} (merged from the bucket into {out})")
    if not chosen.inference_ready:
        merge_fn(chosen, None)
        return Model(chosen.hf_dir, name, f"{chosen.id} (merged into {chosen.hf_dir})")
    return Model(chosen.hf_dir, name, f"{chosen.id} ({chosen.hf_dir})")


def resolve_adapter(target: str, adapter_fn: Callable) -> Model:
    """`target`, a LoRA run's checkpoint on this machine -> its base model with the adapter on
    top. `adapter_fn(checkpoint)` writes the checkpoint's adapter/ folder when it is missing."""
    found = _lookup(target)
    chosen, name = found if not isinstance(found, Model) else (None, None)
    if chosen is None or not chosen.lora_rank:
        what = found.origin if chosen is None else chosen.id
        raise ServeError(
            f"error: {what} is not a LoRA run's checkpoint: --adapter has no adapter to serve",
            ["serve it without --adapter"],
        )
    if "://" in chosen.path:
        raise ServeError(
            f"error: --adapter serves checkpoints on this machine; {chosen.id} is in a bucket",
            ["serve it without --adapter (its merged model)"],
        )
    folder = Path(chosen.path) / "adapter"
    if not (folder / "adapter_model.safetensors").is_file():
        adapter_fn(chosen)
    try:
        base = base_model(load_object(folder / "adapter_config.json"))
    except (OSError, ValueError, AttributeError) as e:  # damaged by hand: merge --adapter-only writes it anew
        raise ServeError(
            f"error: {folder}/adapter_config.json cannot be read ({str(e)[:80]})",
            [f"remove {folder} and serve again: it is written anew from the checkpoint"],
        ) from None
    origin = f"{chosen.id}'s LoRA adapter (rank {chosen.lora_rank}) on {base}"
    return Model(str(base), name, origin, adapter=str(folder), adapter_rank=chosen.lora_rank)


def resolve_for_cloud(target: str) -> Model:
    """`target` -> a model a cloud replica can load: a Hub id, or a merged model in a bucket
    (`path` is then its URL, mounted on the replica)."""
    found = _lookup(target)
    if isinstance(found, Model):
        if "/" in found.path and Path(found.path).exists():
            raise ServeError(
                f"error: a cloud replica cannot read {found.path} on this machine",
                ["push it to the Hub (r1cloud merge … --push-to-hub ORG/NAME) or put it in a bucket"],
            )
        return found
    chosen, name = found
    if "://" not in chosen.path:
        raise ServeError(
            f"error: {chosen.id} is on this machine, where a cloud replica cannot read it",
            [f"push it: r1cloud merge {chosen.id} --push-to-hub ORG/NAME, then serve ORG/NAME"],
        )
    if not chosen.inference_ready:
        raise ServeError(
            f"error: {chosen.id} is not merged in its bucket yet",
            [f"r1cloud merge {chosen.id}  (writes the merged model next to it in the bucket)"],
        )
    return Model(chosen.hf_dir, name, f"{chosen.id} ({chosen.hf_dir})")


def pick_engine(requested: str, fallback: str = "transformers") -> str:
    """The engine `--engine` names; `auto`: vLLM when it is installed, else `fallback` (serve's
    transformers server, eval's hf engine)."""
    if requested not in ("auto", "vllm", fallback):
        raise ServeError("error: bad --engine", [f"{requested!r}: use auto, vllm or {fallback}"])
    has_vllm = importlib.util.find_spec("vllm") is not None
    if requested == "vllm" and not has_vllm:
        raise ServeError(
            "error: vLLM is not installed here",
            [f"install it (scripts/install does), or use --engine {fallback}"],
        )
    if requested == "auto":
        return "vllm" if has_vllm else fallback
    return requested


def job_spec(target: str):
    """The resolved spec of the job `target` names (JOB or JOB:step-N), or None for anything else."""
    store, name = JobStore(), parse_ref(target)[0]
    if "://" in target or not store.has(name) or not (spec_file := store.path(name) / "spec.yaml").is_file():
        return None
    return load_resolved(spec_file)


TOOL_FORMATS = ("auto", "hermes", "python", "none")


def tool_format(requested: str, target: str) -> str | None:
    """The tool-call format the server reads: the one asked for, or (`auto`) the job's own when its
    run called tools; None for none."""
    if requested not in TOOL_FORMATS:
        raise ServeError("error: bad --tool-call-format", [f"{requested!r}: use {', '.join(TOOL_FORMATS)}"])
    if requested != "auto":
        return None if requested == "none" else requested
    spec = job_spec(target)
    if spec is None or not spec.worker.rollout.multi_turn.enable:
        return None
    mt = spec.worker.rollout.multi_turn
    try:
        return mt.tool_call_format if tool_schemas(mt) else None
    except (ValueError, OSError) as e:  # its tools file moved or broke since the run
        raise ServeError(f"error: the job's tools cannot be read: {e}", ["pass --tool-call-format"]) from None


def tool_flags(fmt: str | None) -> list[str]:
    """vLLM's server arguments for OpenAI tool calling in `fmt`: its own Hermes parser, or
    r1cloud's plugin for the `python` format (agents/vllm_tools.py)."""
    if fmt is None:
        return []
    if fmt == "hermes":
        return ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    plugin = ["--tool-parser-plugin", "r1cloud.agents.vllm_tools", "--tool-call-parser", "r1cloud_python"]
    return ["--enable-auto-tool-choice", *plugin]


def command(
    engine: str, model: Model, host: str, port: int, name: str, max_model_len: int | None, extra: list[str]
) -> list[str]:
    limit = ["--max-model-len", str(max_model_len)] if max_model_len else []
    if model.adapter:  # the base under NAME-base, the adapter under NAME (vLLM only: the CLI checks)
        rank = str(vllm_max_rank(model.adapter_rank))
        limit += ["--enable-lora", "--lora-modules", f"{name}={model.adapter}", "--max-lora-rank", rank]
        name = f"{name}-base"
    if engine == "vllm":  # vLLM's server module through r1cloud's launcher (Qwen-VL without torchvision)
        head = [sys.executable, "-m", "r1cloud.serving.vllm_server", "--model", model.path]
    else:
        head = [sys.executable, "-m", "r1cloud.serving.openai_server", model.path]
    return [*head, "--host", host, "--port", str(port), "--served-model-name", name, *limit, *extra]


def media_limits(argv: list[str], config) -> list[str]:
    """`argv` for a vision-language model: a video per prompt for Qwen-VL (pixels normalized by the
    processor: vLLM's Qwen3-VL video path would normalize them twice; frames sampled by vLLM's Qwen
    loader, which it picks only for transformers' own video processor class), none for the others —
    unless the arguments say otherwise."""
    if getattr(config, "vision_config", None) is None:
        return argv
    out = list(argv)
    video = getattr(config, "model_type", "") in VIDEO_FAMILIES
    if not any(a.startswith("--limit-mm-per-prompt") for a in argv):
        out += ["--limit-mm-per-prompt", json.dumps({"video": 1 if video else 0})]
    if video and not any(a.endswith("mm-device-do-normalize") for a in argv):
        out.append("--no-mm-device-do-normalize")
    if video and not any(a.startswith("--media-io-kwargs") for a in argv):  # vLLM's Qwen frame sampling
        loader = "qwen3_vl" if config.model_type.startswith("qwen3") else "qwen2_vl"  # (2 a second), which
        out += ["--media-io-kwargs", json.dumps({"video": {"video_backend": loader}})]  # it picks by class
    return out


def key_env(api_key: str | None) -> dict[str, str]:
    return {"VLLM_API_KEY": api_key, "R1CLOUD_API_KEY": api_key} if api_key else {}


# What a failed engine's log says, and what to do about it: the port first (a bind fails after
# everything else started), then vLLM's own error texts, never its start-up chatter.
CAUSES = (
    (("Address already in use",), "the port is taken: pick another with --port"),
    (
        (
            "out of memory",
            "Cannot allocate memory",
            "No available memory for the cache blocks",
            "larger than the maximum number of tokens that can be stored in KV cache",
        ),
        "not enough memory for the model and its KV cache: lower --max-model-len, or size the cache "
        "(VLLM_CPU_KVCACHE_SPACE=GiB on CPU, -- --gpu-memory-utilization 0.8 on a GPU)",
    ),
    (
        ("are not supported for now", "is not supported by vLLM", "Model architectures"),
        "vLLM does not support this model: serve it with --engine transformers",
    ),
)


def failure_cause(lines: list[str]) -> str | None:
    """The likely cause of an engine that did not start, read from its last error on, with the fix."""
    start = max((i for i, ln in enumerate(lines) if "Traceback" in ln or "ERROR" in ln), default=0)
    text = "\n".join(lines[start:])
    for needles, cause in CAUSES:
        if any(n in text for n in needles):
            return cause
    return None


def _passed_length(extra: list[str]) -> int | None:
    """A `--max-model-len` passed through to vLLM after `--` (the last one wins, as in vLLM)."""
    flag = "--max-model-len"
    pairs = zip(extra, [*extra[1:], ""], strict=False)  # each argument and the one after it
    values = [v if a == flag else a.removeprefix(f"{flag}=") for a, v in pairs if a.startswith(flag)]
    return next((int(v) for v in reversed(values) if v.isdigit()), None)


def kv_cache_env(model_path: str, max_model_len: int | None, extra: list[str]) -> dict[str, str]:
    """vLLM's CPU build sizes its KV cache from VLLM_CPU_KVCACHE_SPACE (GiB), else claims most of
    the machine's memory and fails when other processes hold some. Sized here to four sequences of
    the longest context the model is served with (1 GiB at least), unless the user set it or passed
    --gpu-memory-utilization / --kv-cache-memory. (The GPU build ignores the variable.)"""
    if os.environ.get("VLLM_CPU_KVCACHE_SPACE") or any(
        a.split("=")[0] in ("--gpu-memory-utilization", "--kv-cache-memory", "--kv-cache-memory-bytes")
        for a in extra
    ):
        return {}
    config = model_config(model_path)
    if config is None:
        return {"VLLM_CPU_KVCACHE_SPACE": "4"}  # a Hub id, read by vLLM itself: a generous default
    text = text_config(config)
    dtype_bytes = 4 if str(text.get("torch_dtype") or config.get("torch_dtype")) == "float32" else 2
    per_token = kv_bytes_per_token(config, dtype_bytes)
    length = _passed_length(extra) or max_model_len or min(text.get("max_position_embeddings") or 8192, 32768)
    return {"VLLM_CPU_KVCACHE_SPACE": str(max(1, math.ceil(per_token * length * 4 / 1024**3)))}


def check_port(host: str, port: int) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except (socket.gaierror, UnicodeError) as e:
            raise ServeError(
                f"error: --host {host[:80]!r} is not an address ({getattr(e, 'strerror', None) or e})",
                [
                    "give an address of this machine: 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)"
                ],
            ) from None
        except OSError as e:
            if e.errno == errno.EADDRNOTAVAIL:
                raise ServeError(
                    f"error: --host {host} is not an address of this machine",
                    ["give 127.0.0.1 (this machine only), 0.0.0.0 (every interface) or one of its addresses"],
                ) from None
            raise ServeError(
                f"error: cannot listen on {host}:{port}: {e.strerror or e}",
                [
                    f"something else holds port {port} (see: ss -ltnp 'sport = :{port}');"
                    " pick another with --port, or stop it (`r1cloud jobs` lists r1cloud's servers)"
                ],
            ) from None


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on, for a server started a moment later. Drawn at random from 20000 up
    to the kernel's ephemeral range (from which it hands out ports to outgoing connections and to
    binds of port 0: one of those could take a port freed by a port-0 bind before the server binds
    it) and above Ray's worker ports (10002-19999); port 0's way where that range is unknown or low."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    draw = random.SystemRandom()
    for _ in range(64 if low > 21000 else 0):
        with socket.socket() as s:
            try:
                s.bind((host, draw.randrange(20000, low)))
                return s.getsockname()[1]
            except OSError:
                continue
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def base_url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://{shown}:{port}/v1"


def models(url: str, api_key: str | None, timeout: float = 5.0) -> list[str]:
    """The model ids an endpoint serves. Raises urllib.error.HTTPError/URLError when it does not."""
    req = urllib.request.Request(f"{url.rstrip('/')}/models")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return [m["id"] for m in json.load(r)["data"]]


def wait_ready(url: str, api_key: str | None, running: Callable[[], bool], timeout: float) -> bool:
    """True once `/v1/models` answers; False if the server process ends first or `timeout` passes."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        with contextlib.suppress(urllib.error.URLError, OSError, ValueError):
            models(url, api_key, timeout=2.0)
            return True
        if not running():
            return False
        time.sleep(0.5)
    return False


def snippets(url: str, name: str, keyed: bool) -> str:
    key_header = ' -H "Authorization: Bearer $R1CLOUD_API_KEY"' if keyed else ""
    key_arg = 'os.environ["R1CLOUD_API_KEY"]' if keyed else '"none"'
    body = json.dumps({"model": name, "messages": [{"role": "user", "content": "What is 2+3?"}]})
    return (
        f"curl {url}/chat/completions{key_header} -H 'Content-Type: application/json' \\\n"
        f"  -d '{body}'\n\n"
        "import os\n"
        "from openai import OpenAI\n"
        f'client = OpenAI(base_url="{url}", api_key={key_arg})\n'
        f'reply = client.chat.completions.create(model="{name}", '
        'messages=[{"role": "user", "content": "What is 2+3?"}])\n'
        "print(reply.choices[0].message.content)"
    )
