"""`r1cloud eval`: each target answers held-out prompts, the run's reward scores the answers, and
accuracy, pass@k and the rest are reported side by side (evaluation/metrics.py).

One target at a time, each in its own process (`python -m r1cloud.evaluation.run DIR`), through the
parts the trainer's validation uses: the prompt set (data/loader.py), the rollout engine (vLLM, or
transformers' generate where vLLM is absent) and the reward pool (rewards/pool.py). So a
`trainer.val_only` run and `eval` agree on the same checkpoint: the same prompts in the same
batches, drawn with the same seeds as a one-worker validation at step 0. An endpoint target (a URL)
is asked through the official `openai` client with the format prompt applied to each question; the
server's chat template does the rest. Each batch's scored samples are appended to DIR/samples.jsonl
as soon as they are scored: an interrupted eval keeps them.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from r1cloud.agents import episodes
from r1cloud.agents.tools import tool_schemas
from r1cloud.core.dtypes import torch_dtype
from r1cloud.core.families import model_config, model_context
from r1cloud.core.rows import conversation
from r1cloud.data import no_sklearn
from r1cloud.data import prompts as templates
from r1cloud.rewards import pool as rewards
from r1cloud.rollout.engine import Request, Sampling, eos_ids, refuse_unknown_sampling, request_seed
from r1cloud.rollout.sampling import for_rank
from r1cloud.rollout.sampling import sampling as rollout_sampling
from r1cloud.spec import dump_spec, load_resolved

BATCH = 64  # prompts per batch when the spec sets no data.val_batch_size


@dataclass
class Target:
    ref: str  # as the user wrote it
    model: str = ""  # a local folder an engine loads
    url: str = ""  # or an OpenAI-compatible endpoint
    served: str = ""  # the endpoint's model name
    origin: str = ""  # what it is, for the user
    folder: Path = field(default_factory=Path)  # its samples, spec and engine log


def validation_sampling(spec, n: int | None, temperature: float | None, max_tokens: int | None) -> dict:
    """The trainer's validation sampling at step 0 on its one worker (val_override_config over the
    rollout's, seed and all), with the options on top."""
    out = for_rank(rollout_sampling(spec, 0, validation=True), 0)
    for key, value in (("n", n), ("temperature", temperature), ("max_tokens", max_tokens)):
        if value is not None:
            out[key] = value
    return out


def prepare(
    target: Target, spec, sampling: dict, engine: str, limit: int | None, api_key: str | None
) -> None:
    """Write the target's folder: the spec it runs with and what to run."""
    target.folder.mkdir(parents=True, exist_ok=True)
    if target.model:
        spec = spec.model_copy(deep=True)
        spec.worker.actor.model.model_path = target.model
        spec.worker.actor.model.tokenizer_path = target.model
    (target.folder / "spec.yaml").write_text(dump_spec(spec))
    job = {key: getattr(target, key) for key in ("ref", "model", "url", "served")}
    job |= {"engine": engine, "sampling": sampling, "limit": limit}
    (target.folder / "target.json").write_text(json.dumps(job, indent=2))
    (target.folder / "samples.jsonl").unlink(missing_ok=True)
    if api_key:  # the endpoint's key reaches the child through its environment, never a file
        os.environ["R1CLOUD_EVAL_API_KEY"] = api_key


def read_timing(folder: Path) -> dict:
    """Seconds spent generating and scoring (and writing) so far."""
    path = folder / "timing.json"
    return json.loads(path.read_text()) if path.exists() else {}


def read_samples(folder: Path) -> list[dict]:
    """The samples scored so far (a line cut by an interruption is left out)."""
    out = []
    path = folder / "samples.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
    return out


# --------------------------------------------------------------------------- the child process
def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr, flush=True)
    return 2


def main(folder: str) -> int:
    no_sklearn.install()
    d = Path(folder)
    job = json.loads((d / "target.json").read_text())
    spec = load_resolved(d / "spec.yaml")
    sampling = Sampling(**job["sampling"])
    try:
        prompts, generate, decode = (_endpoint if job["url"] else _engine)(spec, job, sampling)
    except (ValueError, OSError) as e:  # the data, or a model that is not there: one line
        return _fail(str(e))
    if job["url"] and spec.worker.rollout.multi_turn.enable:
        return _fail(
            "the run's episodes call tools, which an endpoint target does not do here: evaluate "
            "the checkpoint itself (r1cloud eval JOB), which plays whole episodes"
        )
    reward = rewards.from_config(spec.worker.reward)
    if job["url"] and reward.sends_prompt:
        reward.close()
        return _fail(
            "the reward reads each prompt as the model saw it (chat template and all), which an "
            "endpoint does not tell: evaluate the checkpoint itself"
        )
    skip = spec.worker.reward.skip_special_tokens
    indices = list(range(len(prompts)))
    # the trainer's validation batches when the spec sets their size; without it the trainer takes
    # the whole set at once, and eval 64 prompts at a time (progress, and Ctrl-C keeps whole batches):
    # a seed goes by a sample's place in its batch, so beyond 64 prompts the samples differ
    size = batch_size(spec)
    print(f"[eval] 0/{len(indices)} prompts", flush=True)
    timing = {"generate_s": 0.0, "score_s": 0.0}  # where the time goes, in samples.jsonl's summary
    try:
        with open(d / "samples.jsonl", "a") as out:
            for start in range(0, len(indices), size):
                tick = time.perf_counter()
                # [(prompt, response, length, finished, episode)]
                batch = generate(indices[start : start + size])
                timing["generate_s"] += time.perf_counter() - tick
                tick = time.perf_counter()
                # an episode's answer is its last turn; its record keeps every turn
                texts = [decode(e["answer"] if e else response) for _, response, _, _, e in batch]
                inputs = [
                    rewards.reward_input(reward, decode.tokenizer, prompts[i], text, length, skip)
                    for (i, _, length, _, _), text in zip(batch, texts, strict=True)
                ]
                scores, _ = reward(inputs)
                seen: dict[int, int] = {}
                for (i, response, length, finished, e), text, score in zip(batch, texts, scores, strict=True):
                    p = prompts[i]
                    j = seen[i] = seen.get(i, -1) + 1
                    record = {"prompt": i, "sample": j, "data_source": p.extra.get("data_source")}
                    record |= {"question": p.content, "response": text, "ground_truth": p.ground_truth}
                    record |= {"scores": score, "length": length, "finished": finished}
                    if e:
                        record["scores"] = episodes.with_environment(score, e["reward"])
                        record["episode"] = {**e["stats"], "transcript": decode.transcript(response)}
                    out.write(json.dumps(record, default=str) + "\n")
                out.flush()
                timing["score_s"] += time.perf_counter() - tick
                (d / "timing.json").write_text(json.dumps(timing))
                print(f"[eval] {min(start + size, len(indices))}/{len(indices)} prompts", flush=True)
    except KeyboardInterrupt:  # what was scored is in samples.jsonl
        return 130
    finally:
        reward.close()
    return 0


class _Decoder:
    def __init__(self, tokenizer, skip: bool):
        self.tokenizer, self.skip = tokenizer, skip

    def __call__(self, response) -> str:
        if isinstance(response, str):
            return response
        return self.tokenizer.decode(response, skip_special_tokens=self.skip)

    def transcript(self, response: list[int]) -> str:
        """An episode's turns, with the chat template's headers that tell them apart."""
        return self.tokenizer.decode(response, skip_special_tokens=False)


def _engine(spec, job: dict, sampling):
    """The prompt set, a generate over prompt indices, and the decoder, for an engine here."""
    import torch

    from r1cloud.data.loader import PromptSet, load_tokenizer

    m, r = spec.worker.actor.model, spec.worker.rollout
    tokenizer, processor = load_tokenizer(m, spec.data)
    prompts = PromptSet(
        spec.data.val_files,
        tokenizer,
        spec.data,
        processor=processor,
        limit=job["limit"],
        tools=tool_schemas(r.multi_turn),
        environment=bool(r.multi_turn.enable and r.multi_turn.environment),
    )
    agent = None
    if r.multi_turn.enable:
        agent = episodes.Agent.of(r.multi_turn, spec.data, tokenizer, processor, spec.worker.reward.num_cpus)
    eos = eos_ids(m.model_path, tokenizer)
    if job["engine"] == "vllm":
        _one_process_world()
        engine = vllm_engine(spec, prompts.prompts, sampling, eos)
    else:
        from r1cloud.rollout.hf import HFEngine

        refuse_unknown_sampling("hf", sampling.extra)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        engine = HFEngine(m.model_path, eos, tokenizer.pad_token_id, torch_dtype(r.dtype), device)

    def generate(indices: list[int]) -> list[tuple]:
        requests = []
        for i in indices:
            p = prompts.prompts[i]
            tensors = prompts.image_inputs(i) if engine.name == "hf" else {}
            clips = prompts.clips(i) if engine.name == "vllm" else []
            requests.append(Request(p.prompt_ids, p.raw_ids, p.images, tensors, p.reset, clips))
        if agent is None:
            return [
                (indices[s.prompt], s.response, len(s.response), s.finished, None)
                for s in engine.generate(requests, sampling)
            ]
        out = []
        for s in episodes.run(engine, requests, sampling, agent):
            answer = episodes.last_turn(torch.tensor(s.response), torch.tensor(s.mask), len(s.response))
            e = {"answer": answer, "reward": s.reward, "stats": s.stats}
            out.append((indices[s.prompt], s.response, len(s.response), s.finished, e))
        return out

    return prompts.prompts, generate, _Decoder(tokenizer, spec.worker.reward.skip_special_tokens)


def vllm_engine(spec, prompts: list, sampling, eos: set[int]):
    """vLLM scoring `prompts` in this one process: no tensor parallelism whatever the spec says
    (EasyR1's default of 2 is the trainer's), a context for these prompts, and on CPU a KV cache
    for one batch's sequences (prompts × n)."""
    from r1cloud.rollout.vllm import VLLMEngine

    m, r = spec.worker.actor.model, spec.worker.rollout
    length = context_length(m.model_path, r, [len(p.prompt_ids) for p in prompts], sampling.max_tokens)
    r = r.model_copy(update={"max_model_len": length, "tensor_parallel_size": 1})
    return VLLMEngine(
        m.model_path,
        m.tokenizer_path,
        r,
        eos,
        seed=r.seed,
        videos=max((len(p.videos) for p in prompts), default=0),
        sequences=min(batch_size(spec), len(prompts)) * sampling.n,
    )


def batch_size(spec) -> int:
    """Prompts a batch: the trainer's validation batch when the spec sets one, else BATCH."""
    return spec.data.val_batch_size if spec.data.val_batch_size > 0 else BATCH


def context_length(model_path: str, rollout, prompt_lengths: list[int], max_tokens: int) -> int:
    """vLLM's max_model_len for scoring: what these prompts and max_tokens need, else the
    blueprint's prompt + response lengths cut to the model's own context (config.json) — never the
    blueprint's alone, which may be longer than the model can take."""
    need = max(prompt_lengths, default=1) + max_tokens
    planned = rollout.max_model_len or rollout.prompt_length + rollout.response_length
    config = model_config(model_path)
    context = (model_context(config) if config is not None else None) or planned
    return max(need, min(planned, context))


def _one_process_world() -> None:
    """vLLM's external launcher joins a torch.distributed world: here, one of one process."""
    import torch.distributed as dist

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # no port to race for


def _endpoint(spec, job: dict, sampling):
    """The rows, a generate that asks the endpoint (eight requests at a time), and the decoder."""
    from openai import OpenAI

    from r1cloud.data.loader import Prompt, load_rows

    d = spec.data
    template = templates.load(d.format_prompt) if d.format_prompt else None
    prompts = []
    for source in [d.val_files] if isinstance(d.val_files, str) else d.val_files:
        rows = load_rows(source)
        if d.image_key in rows.column_names and any(rows[d.image_key]):
            raise ValueError(
                f"{source}: rows hold images, and an endpoint target is asked text only here: evaluate the "
                "checkpoint itself (r1cloud eval JOB), which sends the images"
            )
        if missing := [k for k in (d.prompt_key, d.answer_key) if k not in rows.column_names]:
            raise ValueError(
                f"{source}: no column {missing[0]!r} (its columns: {', '.join(rows.column_names)}); "
                "set --prompt-key/--answer-key"
            )
        own = {d.prompt_key, d.answer_key, d.image_key, d.video_key}
        for i, row in enumerate(rows):
            extra = {k: v for k, v in row.items() if k not in own}
            history, content = conversation(row[d.prompt_key], f"{source}: row {i}")
            prompts.append(Prompt(len(prompts), [], str(row[d.answer_key]), extra, content, history=history))
    prompts = prompts[: job["limit"]] if job["limit"] else prompts
    client = OpenAI(
        base_url=job["url"], api_key=os.environ.get("R1CLOUD_EVAL_API_KEY") or "none", max_retries=2
    )

    # beyond the OpenAI API's own fields, vLLM's (an OpenAI server would refuse them): only when set
    extra = {**sampling.extra}
    if sampling.top_k > 0:
        extra["top_k"] = sampling.top_k
    if sampling.ignore_eos:
        extra["ignore_eos"] = True

    def ask(i: int, j: int) -> tuple:
        content = prompts[i].content
        reply = client.chat.completions.create(
            model=job["served"],
            messages=[
                *prompts[i].history,
                {"role": "user", "content": template.render(content=content) if template else content},
            ],
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            seed=request_seed(sampling.seed, i, j),
            extra_body=extra or None,
        )
        choice = reply.choices[0]
        length = reply.usage.completion_tokens if reply.usage else 0
        return i, choice.message.content or "", length, choice.finish_reason == "stop", None

    def generate(indices: list[int]) -> list[tuple]:
        work = [(i, j) for i in indices for j in range(sampling.n)]
        with ThreadPoolExecutor(8) as pool:
            return list(pool.map(lambda w: ask(*w), work))

    return prompts, generate, _Decoder(None, True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
