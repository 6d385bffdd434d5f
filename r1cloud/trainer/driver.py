"""The single controller: owns the RL loop and tells the worker group what to do.

One step: prompts -> rollout (n samples each) -> rewards -> old/ref log-probs -> advantages ->
actor update -> weight sync -> metrics -> checkpoint. Reads only the resolved spec in the run
directory; writes metrics.jsonl and checkpoints there.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import torch

from r1cloud.agents.episodes import STATS, BadRow, last_turn, with_environment
from r1cloud.agents.tools import tool_schemas
from r1cloud.checkpoint.write import Bucket, Checkpoints, DamagedCheckpoint, read_state, write_hf_files
from r1cloud.core.budget import EXIT, Budget
from r1cloud.data.loader import Loader, PromptSet, check_sets, chunk_evenly, load_tokenizer
from r1cloud.rewards import pool as rewards
from r1cloud.rollout.engine import Request, pick_engine, refuse_unknown_sampling
from r1cloud.rollout.sampling import engine_sequences, for_rank
from r1cloud.rollout.sampling import sampling as spec_sampling
from r1cloud.spec import Spec, load_resolved
from r1cloud.trainer import algorithms as alg
from r1cloud.trainer.batch import Batch, decode, episode_fields, packed, ragged, tool_images, unpacked
from r1cloud.trainer.group import RunError, failed_pool, gather, launch, start_failure, worker_lost
from r1cloud.trainer.metrics import (
    Timer,
    actor_metrics,
    critic_metrics,
    forget_after,
    perf_metrics,
    progress_line,
    rollout_metrics,
    stats,
)
from r1cloud.trainer.placement import Sizes, localize, rank_plan
from r1cloud.trainer.rollout_worker import WEIGHTS
from r1cloud.trainer.stream import Stream
from r1cloud.trainer.trackers import TrackerError, Trackers, val_samples


@dataclass
class Sent:
    """Prompts sent to the engines (Trainer.submit): what Trainer.collect needs to make a Batch."""

    prompt_set: PromptSet
    indices: list[int]
    chunks: list[list[int]]  # each data-parallel rank's prompts
    inputs: dict  # image inputs, once per prompt
    calls: list  # the workers' generate calls (Ray refs)
    tp: int
    seconds: list[float] = field(default_factory=list)  # each rollout worker's time generating (collect)


class Trainer:
    def __init__(self, run_dir: str | Path, spec: Spec | None = None, launch_first: bool = False):
        self.run_dir = Path(run_dir)
        self.spec = spec or load_resolved(self.run_dir / "spec.yaml")
        s, self.world, self.workers, self.rollouts = self.spec, self.spec.world_size, [], []
        self.stream = None  # asynchronous training's rollout stream (start_workers)
        r = s.worker.rollout
        if launch_first:  # the workers load their models while this process reads the data
            self.launch_workers()
        self.tokenizer, self.processor = load_tokenizer(s.worker.actor.model, s.data)
        sets = {
            "processor": self.processor,
            "tools": tool_schemas(r.multi_turn),
            "environment": bool(r.multi_turn.environment),
        }

        def prompt_set(files, **probs) -> PromptSet | None:
            return PromptSet(files, self.tokenizer, s.data, **probs, **sets) if files else None

        self.train_set = prompt_set(s.data.train_files, probs=s.data.train_files_probs)
        self.val_set = prompt_set(s.data.val_files)
        if r.enable_chunked_prefill and r.name != "hf" and not torch.cuda.is_available():
            raise ValueError(
                "worker.rollout.enable_chunked_prefill: vLLM's CPU build crashes on a chunked prompt of a "
                "seeded request, so on CPU r1cloud schedules whole prompts; set it to false here"
            )
        if s.worker.actor.model.freeze_language_model and getattr(self.train_set, "vision", 0) is None:
            raise ValueError(
                "worker.actor.model.freeze_language_model: a text model has nothing else to train"
            )
        self.reward = rewards.from_config(s.worker.reward)
        batch = s.data.mini_rollout_batch_size or s.data.rollout_batch_size
        sets = {"train": self.train_set, "val": self.val_set}
        check_sets(sets, s.data, r.limit_images, self.reward.wants, batch, self.log)
        train = self.train_set
        self.loader = Loader(len(train), batch, s.data.seed, s.data.shuffle) if train is not None else None
        per_epoch = self.loader.batches_per_epoch if self.loader else 0
        self.steps = s.trainer.max_steps or s.trainer.total_epochs * per_epoch  # EasyR1's count
        ckpt_root = s.trainer.save_checkpoint_path or str(self.run_dir / "checkpoints")
        # a bucket URL: every worker writes its shards there directly (see Bucket)
        self.checkpoints = Bucket(ckpt_root) if "://" in ckpt_root else Checkpoints(ckpt_root)
        self.trackers = Trackers(s, self.run_dir, self.log, mirror=ckpt_root if "://" in ckpt_root else None)
        self.kl_coef = s.algorithm.kl_coef
        self.share_prompts = False  # whether the workers pack a group's prompt once (start_workers)
        self.stopped = ""  # what ended the run early (fit): "stop" (a request) or "budget"
        self.budget = Budget.from_env(s.resources.max_cost)

    # ------------------------------------------------------------------ plumbing
    def log(self, text: str) -> None:
        print(text, flush=True)

    def call(self, method: str, *args, **kwargs) -> list:
        return gather([getattr(w, method).remote(*args, **kwargs) for w in self.workers])

    def launch_workers(self) -> None:
        """Start the workers; they load their models while nothing waits for them."""
        r = self.spec.worker.rollout
        try:  # before any worker starts
            refuse_unknown_sampling(pick_engine(r.name), r.val_override_config)
        except ValueError as e:
            raise RunError(str(e)) from None
        # the store: held while they run
        self.workers, self.rollouts, self.rendezvous = launch(self.spec, self.world, self.spec.rollout_size)

    def start_workers(self) -> str:
        if not self.workers:  # main() launched them first: Trainer(launch_first=True)
            self.launch_workers()
        engine = pick_engine(self.spec.worker.rollout.name)
        self.share_prompts = self.call("shares_prompts")[0]
        self.adapter = self.call("adapter")[0]  # LoRA: adapter_config.json and what it trains
        sets = [rows for rows in (self.train_set, self.val_set) if rows]
        videos = max((len(p.videos) for rows in sets for p in rows.prompts), default=0)
        # its KV cache's size on CPU
        most = engine_sequences(self.spec, len(self.generators), engine, self.val_set)
        names = gather([w.start_engine.remote(engine, videos, most) for w in self.generators])
        self.call("set_schedule", self.steps)
        if self.rollouts:  # train rank 0 and the rollout workers: the weights group
            size, a = len(self.rollouts) + 1, self.spec.async_training
            gather([w.join_weights.remote(size) for w in [*self.workers, *self.rollouts]])
            self.stream = Stream(self, a.bound, a.trigger_parameter_sync_step)
        return names[0]

    @property
    def generators(self) -> list:
        """The workers that hold rollout engines: the rollout workers when asynchronous."""
        return self.rollouts or self.workers

    def push_weights(self, version: int) -> None:
        """The actor's weights (`version` updates in) from train rank 0 to the rollout workers, which
        hold them until a batch sent with that version starts (rollout_worker.py)."""
        gather(
            [w.push_weights.remote() for w in self.workers]
            + [r.receive_weights.options(concurrency_group=WEIGHTS).remote(version) for r in self.rollouts]
        )

    # ------------------------------------------------------------------ rollout
    def generate(self, prompt_set: PromptSet, indices: list[int], sampling: dict) -> Batch:
        """n samples of each prompt, from the rollout engine's data-parallel ranks."""
        return self.collect(self.submit(prompt_set, indices, sampling))

    def submit(self, prompt_set: PromptSet, indices: list[int], sampling: dict) -> Sent:
        """Send the prompts to the workers that hold engines (the rollout workers when asynchronous,
        with the version of the weights to generate with: the last pushed); `collect` makes their
        samples a Batch."""
        tp = self.spec.worker.rollout.tensor_parallel_size if self.engine == "vllm" else 1
        chunks = chunk_evenly(indices, len(self.generators) // tp)
        clips = {i: prompt_set.clips(i) for i in indices if prompt_set.prompts[i].videos}  # decoded once
        inputs = {i: t for i in indices if (t := prompt_set.image_inputs(i, clips.get(i)))}  # once per prompt
        requests = {}
        for i in indices:
            p = prompt_set.prompts[i]
            requests[i] = Request(
                p.prompt_ids, p.raw_ids, p.images, inputs.get(i, {}), p.reset, clips.get(i, [])
            )
        at = {"version": self.stream.version} if self.stream else {}
        calls = [
            w.generate.remote([requests[i] for i in chunks[rank // tp]], for_rank(sampling, rank // tp), **at)
            for rank, w in enumerate(self.generators)
        ]
        return Sent(prompt_set, indices, chunks, inputs, calls, tp)

    def collect(self, sent: Sent) -> Batch:
        prompt_set, indices, chunks, inputs = sent.prompt_set, sent.indices, sent.chunks, sent.inputs
        uids = {i: uuid.uuid4().hex for i in indices}
        results = gather(sent.calls)[:: sent.tp]  # a tensor-parallel group's ranks return the same samples
        sent.seconds = [r.pop("seconds") for r in results if "seconds" in r]
        rows = [c[k] for c, r in zip(chunks, results, strict=True) for k in r["prompt"].tolist()]
        once = {i: k for k, i in enumerate(indices)}  # each prompt's ids made a tensor once
        prompt_ids = ragged([prompt_set.prompts[i].prompt_ids for i in indices], torch.int32)
        prompt_len = torch.tensor([len(prompt_set.prompts[i].prompt_ids) for i in indices], dtype=torch.long)
        at = torch.tensor([once[i] for i in rows], dtype=torch.long)
        pictures = {i: k for k, i in enumerate(inputs)}
        lengths = torch.cat([r["length"] for r in results])
        width = int(lengths.max()) if len(lengths) else 0
        extra = episode_fields(results, lengths, width, STATS) if "mask" in results[0] else {}
        if "prompt_ids" in extra:  # episodes whose environment's reset added to the prompt
            prompt_ids, prompt_len = extra.pop("prompt_ids"), extra.pop("prompt_len")
            at = torch.arange(len(rows))
        return Batch(
            uid=[uids[i] for i in rows],
            index=torch.tensor(rows, dtype=torch.long),
            prompt_ids=prompt_ids[at],
            prompt_len=prompt_len[at],
            response_ids=unpacked(torch.cat([r["response"] for r in results]), lengths, width),
            response_len=lengths,
            finished=torch.cat([r["finished"] for r in results]),
            rollout_logp=unpacked(torch.cat([r["logprobs"] for r in results]), lengths, width),
            **extra,
            image_inputs=[inputs[i] for i in pictures],
            image_of=torch.tensor([pictures.get(i, -1) for i in rows]) if inputs else None,
            tool_images=tool_images(results),
            version=torch.cat([r["version"] for r in results]) if "version" in results[0] else None,
        )

    def score(self, batch: Batch, prompt_set: PromptSet) -> tuple[Batch, int]:
        """The reward function over the batch's responses; returns it with its scores, and the
        number of samples that failed to score."""
        skip = self.spec.worker.reward.skip_special_tokens
        lengths = batch.response_len.tolist()
        if batch.loss_mask is None:
            texts = decode(self.tokenizer, packed(batch.response_ids, batch.response_len), lengths, skip)
        else:  # an episode's answer is its last turn
            texts = [
                self.tokenizer.decode(last_turn(ids, mask, n), skip_special_tokens=skip)
                for ids, mask, n in zip(batch.response_ids, batch.loss_mask, lengths, strict=True)
            ]
        sources = [prompt_set.prompts[i] for i in batch.index.tolist()]
        inputs = [
            rewards.reward_input(self.reward, self.tokenizer, p, t, n, skip)
            for p, t, n in zip(sources, texts, lengths, strict=True)
        ]
        scores, errors = self.reward(inputs)
        if (env := batch.episode.get("env_reward")) is not None:  # added to the function's (as TRL)
            errors += int(env.isnan().sum())  # get_reward() raised: scored 0
            scores = [with_environment(x, r) for x, r in zip(scores, env.tolist(), strict=True)]
        keys = sorted({k for x in scores for k in x})  # a sample that failed scores 0 for every key
        table = {k: torch.tensor([x.get(k, 0.0) for x in scores], dtype=torch.float64) for k in keys}
        return batch.with_(scores=table), errors

    def experience(self, batch: Batch, method: str, cfg, **kwargs) -> torch.Tensor:
        """A forward-only pass of every worker over its shard (`log_probs` or `values`), in `cfg`'s
        experience micro-batches: (B, R) fp32, zero past each response."""
        per_micro = cfg.micro_batch_size_per_device_for_experience
        plan = self.plan(Sizes.of(batch), list(range(len(batch))), per_micro, cfg)
        shards = [localize(micros) for micros in plan]
        results = gather(
            [
                getattr(w, method).remote(batch.select(rows, keep=()), micros, **kwargs)
                for w, (rows, micros) in zip(self.workers, shards, strict=True)
            ]
        )
        out = torch.zeros(batch.response_ids.shape)
        for (rows, _), res in zip(shards, results, strict=True):
            out[rows] = unpacked(res, batch.response_len[rows], out.shape[1])
        return out

    def plan(self, sizes: Sizes, rows: list[int], per_micro: int, role) -> list[list[list[int]]]:
        """Each rank's micro-batches of the batch rows `rows`: `per_micro` samples each, or with
        `role`'s dynamic batching as many tokens as `per_micro` samples of the longest lengths."""
        d = self.spec.data
        budget = per_micro * (d.max_prompt_length + d.max_response_length) if role.dynamic_batching else None
        return rank_plan(sizes, rows, self.world, per_micro, budget, self.share_prompts, role.ulysses_size)

    def make_batch(self, step: int) -> tuple[Batch, Batch, int, int]:
        """Generate and score until the step has `rollout_batch_size` groups (more than one round
        when `mini_rollout_batch_size` is smaller, or when dynamic sampling drops groups). Returns
        the kept samples, every sample generated, the reward errors and the number of rounds."""
        s, a = self.spec, self.spec.algorithm
        kept: list[Batch] = []
        seen: list[Batch] = []
        errors = rounds = groups = 0
        while groups < s.data.rollout_batch_size:
            if 0 < s.trainer.max_try_make_batch <= rounds:
                raise RunError(
                    f"dynamic sampling: after {rounds} rounds only {groups} of {s.data.rollout_batch_size} "
                    f"groups had a mean {a.filter_key} strictly between algorithm.filter_low ({a.filter_low:g}) "
                    f"and algorithm.filter_high ({a.filter_high:g}); raise trainer.max_try_make_batch (≤ 0 "
                    "is unlimited), widen the filter, or use data nearer the model's level"
                )
            rounds += 1
            indices = self.loader.next()
            batch = self.generate(self.train_set, indices, spec_sampling(self.spec, step, round=rounds - 1))
            batch, failed = self.score(batch, self.train_set)
            errors += failed
            seen.append(batch)
            if a.online_filtering:
                if a.filter_key not in batch.scores:
                    raise RunError(
                        f"algorithm.filter_key is {a.filter_key!r}, but the reward function returns "
                        f"{', '.join(batch.scores)}; set filter_key to one of them"
                    )
                values = batch.scores[a.filter_key].tolist()  # a failed sample scores 0
                keep = alg.groups_to_keep(batch.uid, values, a.filter_low, a.filter_high)
                batch = batch.select([i for i, u in enumerate(batch.uid) if u in keep])
            kept.append(batch)
            groups += len(set(batch.uid))
        batch = Batch.cat(kept)
        wanted = set(list(dict.fromkeys(batch.uid))[: s.data.rollout_batch_size])
        batch = batch.select([i for i, u in enumerate(batch.uid) if u in wanted])
        return batch, Batch.cat(seen), errors, rounds

    def greedy_baselines(self, batch: Batch, step: int) -> torch.Tensor:
        """ReMax: each prompt's reward under greedy decoding (temperature 0, one sample)."""
        indices = list(dict.fromkeys(batch.index.tolist()))
        sampling = {**spec_sampling(self.spec, step), "n": 1, "temperature": 0.0}
        greedy = self.generate(self.train_set, indices, sampling)
        greedy, _ = self.score(greedy, self.train_set)
        by_prompt = dict(zip(greedy.index.tolist(), greedy.scores["overall"].tolist(), strict=True))
        return torch.tensor([by_prompt[i] for i in batch.index.tolist()], dtype=torch.float64)

    # ------------------------------------------------------------------ one step
    def train_step(self, step: int) -> dict:
        s, a, actor, timer = self.spec, self.spec.algorithm, self.spec.worker.actor, Timer()
        n_mini = max(1, s.data.rollout_batch_size // actor.global_batch_size)
        on_policy = actor.ppo_epochs == 1 and n_mini == 1
        if self.stream:  # samples up to `bound` updates old: the trainer's log-probs, or the engine's
            on_policy = on_policy and self.stream.bound == 0 and self.stream.sync_every == 1
        kl_in_reward = not a.disable_kl and not a.use_kl_loss
        with timer("step"):
            with timer("gen"):
                if self.stream:
                    batch, errors, streamed = self.stream.take(step)
                    seen, rounds = batch, 1
                else:
                    batch, seen, errors, rounds = self.make_batch(step)
            baselines = None
            if a.estimator.greedy_baseline:
                with timer("gen_baseline"):
                    baselines = self.greedy_baselines(batch, step)
            if self.stream and self.spec.async_training.use_rollout_log_probs:
                batch.old_logp = batch.rollout_logp  # verl's use_rollout_log_probs
            elif not on_policy or kl_in_reward:
                with timer("old"):
                    batch.old_logp = self.experience(batch, "log_probs", actor, role="actor")
            if not a.disable_kl:
                with timer("ref"):
                    batch.ref_logp = self.experience(batch, "log_probs", actor, role="ref")
            if a.estimator.critic:
                with timer("values"):
                    batch.values = self.experience(batch, "values", s.worker.critic)
            with timer("adv"):
                metrics = self.compute_advantages(batch, baselines, kl_in_reward)
            if a.estimator.critic:
                with timer("update_critic"):
                    metrics |= self.update_critic(batch)
            if step >= s.trainer.critic_warmup:  # as EasyR1's ray_trainer.py: warmup <= global_step
                with timer("update_actor"):
                    metrics |= self.update(batch, n_mini, keep_old=not on_policy or actor.rollout_is)
                with timer("sync"):
                    self.stream.push(step) if self.stream else self.call("sync_weights")
        metrics |= rollout_metrics(seen, batch, errors, s.data.max_prompt_length, a.estimator.per_sequence)
        if a.online_filtering or s.data.mini_rollout_batch_size:
            metrics["batch/rounds"] = rounds
            metrics["batch/kept_groups_ratio"] = len(set(batch.uid)) / len(set(seen.uid))
        metrics |= timer.metrics() | perf_metrics(batch, timer.seconds["step"], self.world)
        if self.stream:
            metrics |= streamed
        metrics["perf/old_log_prob_recomputed"] = float(
            batch.old_logp is not None and batch.old_logp is not batch.rollout_logp
        )
        if a.use_kl_loss and not a.disable_kl:
            metrics["actor/kl_coef"] = self.kl_coef
        return metrics

    def compute_advantages(self, batch: Batch, baselines: torch.Tensor | None, kl_in_reward: bool) -> dict:
        """Sets the batch's advantages (and GAE's returns) from its scores, with the KL penalty in
        the reward when it goes there (and the adaptive KL coefficient's update); the metrics."""
        a, mask, metrics = self.spec.algorithm, batch.mask, {}
        scores, kl = batch.scores["overall"], None
        rewards = scores
        if kl_in_reward:
            kl = alg.kl_estimate(batch.old_logp, batch.ref_logp, a.kl_penalty) * mask
            per_token = float((kl.sum(1) / batch.response_len.clamp(min=1)).sum()) / len(batch)
            metrics["actor/kl_penalty"] = per_token
            metrics["actor/kl_coef"] = self.kl_coef
            rewards = scores - self.kl_coef * kl.sum(1).double()
        tokens = alg.token_rewards(scores, mask, batch.response_len, kl, self.kl_coef)
        if kl_in_reward and a.kl_type == "adaptive":
            self.kl_coef = alg.adaptive_kl_coef(
                self.kl_coef, per_token, a.kl_target, len(batch), a.kl_horizon
            )
        outcomes = alg.Outcomes(batch.uid, rewards, tokens, mask, batch.values, baselines)
        batch.advantages, batch.returns = alg.advantages(a, outcomes)
        if baselines is not None:
            metrics |= stats("critic/baseline", baselines)
        return metrics | stats("critic/rewards", rewards)

    def train(self, method: str, batch: Batch, role, n_mini: int, keep: tuple[str, ...]) -> tuple[list, int]:
        """`update` or `update_critic` on every worker, one optimizer step per mini-batch of each of
        `role`'s epochs: its rows of the batch once, with `keep`'s per-token fields, and per step its
        micro-batches as positions in those rows and the mini-batch's global token (or non-empty
        sequence) count that `aggregate` divides by. Each rank's statistics, and the step count."""
        sizes, mask = Sizes.of(batch), batch.mask
        steps = []
        for _ in range(role.ppo_epochs):
            for mini in chunk_evenly(list(range(len(batch))), n_mini):
                plan = self.plan(sizes, mini, role.micro_batch_size_per_device_for_update, role)
                steps.append({"total": max(alg.count_for(role.loss_avg_mode, mask[mini]), 1), "plan": plan})
        calls = []
        for rank, w in enumerate(self.workers):
            rows, micros = localize([m for st in steps for m in st["plan"][rank]])
            at, per_step = 0, []
            for st in steps:
                k = len(st["plan"][rank])
                per_step.append({"total": st["total"], "micro": micros[at : at + k]})
                at += k
            calls.append(getattr(w, method).remote(batch.select(rows, keep=keep), per_step))
        return gather(calls)[:: role.ulysses_size], len(steps)  # a Ulysses group's workers report the same

    def update_critic(self, batch: Batch) -> dict[str, float]:
        c = self.spec.worker.critic
        n_mini = max(1, self.spec.data.rollout_batch_size // c.global_batch_size)
        return critic_metrics(*self.train("update_critic", batch, c, n_mini, ("values", "returns")), batch)

    def update(self, batch: Batch, n_mini: int, keep_old: bool) -> dict[str, float]:
        s = self.spec
        # the engine's log-probs: TIS weighs by them; on-policy the update measures the engine against them
        keep = ("advantages", "ref_logp", "rollout_logp") + (("old_logp",) if keep_old else ())
        results, steps = self.train("update", batch, s.worker.actor, n_mini, keep)
        kl_loss = s.algorithm.use_kl_loss and not s.algorithm.disable_kl
        return actor_metrics(results, steps, s.worker.actor.rollout_is, kl_loss)

    # ------------------------------------------------------------------ validation
    def validate(self, step: int) -> dict[str, float]:
        tick = time.perf_counter()
        if self.stream:  # the rollout workers validate the weights of step `step`
            self.stream.push(step, force=True)
        indices = list(range(len(self.val_set)))
        size = self.spec.data.val_batch_size if self.spec.data.val_batch_size > 0 else len(indices)
        parts = []
        for start in range(0, len(indices), size):
            sampling = spec_sampling(self.spec, step, validation=True)
            batch = self.generate(self.val_set, indices[start : start + size], sampling)
            parts.append(self.score(batch, self.val_set)[0])
        batch = Batch.cat(parts)
        m = {f"val/{k}_reward": float(v.mean()) for k, v in batch.scores.items()}
        m["val/reward_score"] = m["val/overall_reward"]
        m.update(stats("val_response_length", batch.response_len))
        m["timing_s/validation"] = time.perf_counter() - tick
        k = self.spec.trainer.val_generations_to_log
        self.trackers.generations(step, val_samples(batch, self.val_set, self.tokenizer, k))
        return m

    # ------------------------------------------------------------------ checkpoints
    def save(self, step: int, metrics: dict, last: bool = False, stopped: str = "") -> None:
        tick = time.perf_counter()
        where = self.checkpoints.begin(step)
        only = self.spec.trainer.save_model_only
        for role in self.spec.roles:
            self.call("save", f"{where}/{role}", role=role, model_only=only)
        saver = self.processor or self.tokenizer  # a VLM's processor files carry its tokenizer
        hf, adapter = last and self.spec.trainer.save_hf, self.adapter and self.adapter["config"]
        write_hf_files(
            self.checkpoints, where, self.spec.worker.actor.model, saver, self.run_dir, hf, adapter
        )
        state = {
            "step": step,
            "loader": self.stream.loader_state() if self.stream else self.loader.state_dict(),
            "in_flight": len(self.stream.queue) if self.stream else 0,  # generated again on resume
            "scheduler": self.call("scheduler_state")[0],
            "critic_scheduler": self.call("scheduler_state", role="critic")[0],
            "kl_coef": self.kl_coef,
            "metrics": metrics,
            "world_size": self.world,
            "model_only": only,
            "stopped": stopped,  # why it stopped here, if it did (a cloud job's budget stop: remote.py)
            "launched": self.budget and self.budget.started,  # which launch of the job saved it
        }
        self.checkpoints.publish(where, step, state, metrics.get("val/reward_score"))
        self.checkpoints.prune(self.spec.trainer.save_limit)
        metrics["timing_s/save_checkpoint"] = time.perf_counter() - tick

    def resume(self) -> int:
        s = self.spec.trainer
        if s.load_checkpoint_path:
            path = s.load_checkpoint_path.rstrip("/")
            state = read_state(path)
            step = state["step"]
        elif s.find_last_checkpoint and (found := self.checkpoints.latest()):
            step, path = found
            state = read_state(path)
        else:
            return 0
        optimizer = not state.get("model_only")
        self.call("load", f"{path}/actor", state.get("scheduler"), optimizer=optimizer)
        if self.spec.algorithm.estimator.critic and state.get("critic_scheduler") is not None:
            self.call(
                "load", f"{path}/critic", state.get("critic_scheduler"), role="critic", optimizer=optimizer
            )
        self.kl_coef = state.get("kl_coef", self.kl_coef)
        self.loader.load_state_dict(state["loader"])
        fresh = "" if optimizer else "; model only (trainer.save_model_only): the optimizer starts afresh"
        if state.get("in_flight"):  # asynchronous: batches sampled but not trained when it was saved
            fresh += f"; {state['in_flight']} batch(es) in flight then are generated again"
        self.log(
            f"[resume] from step {step} ({path}), saved with {state.get('world_size')} workers, now {self.world}{fresh}"
        )
        return step

    # ------------------------------------------------------------------ the loop
    def fit(self) -> None:
        s = self.spec
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.trackers.start()  # before the workers' first call: a tracker that cannot start ends it here
        self.engine = self.start_workers()
        stop = []  # after ray.init, which installs its own SIGTERM handler
        signal.signal(signal.SIGTERM, lambda *_: stop.append("[stop] stopped"))  # finish the step, save, exit
        packing = "each group's prompt packed once" if self.share_prompts else "a prompt copy per sample"
        self.log(f"[start] {self.world} workers, rollout engine {self.engine}, {self.steps} steps, {packing}")
        if self.adapter:
            self.log(f"[start] {self.adapter['line']}")
        if note := self.call("offload_note")[0]:
            self.log(f"[start] {note}")
        nodes = sorted(set(ips := self.call("node_ip")))
        if len(nodes) > 1:
            self.log("[start] workers on " + ", ".join(f"{ip} ×{ips.count(ip)}" for ip in nodes))
        start = self.resume() if self.loader else 0
        forget_after(self.run_dir / "metrics.jsonl", start)
        if start:
            self.trackers.resumed(start)
        device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
        info = {"total_steps": self.steps, "engine": self.engine, "workers": self.world, "device": device}
        info["resumed_from"] = start
        (self.run_dir / "trainer.json").write_text(json.dumps(info))
        self.stream.start(start) if self.stream else self.call("sync_weights")
        if self.val_set and (s.trainer.val_only or s.trainer.val_before_train):  # resumed: ray_trainer.py:578
            m = self.validate(start)
            self.trackers.record(start, m)
            self.log(f"[val] step {start}: reward {m['val/reward_score']:.3f}")
            if s.trainer.val_only:
                return
        for step in range(start + 1, self.steps + 1):
            began = time.time()
            metrics = self.train_step(step)
            last = step == self.steps
            if self.val_set and ((s.trainer.val_freq > 0 and step % s.trainer.val_freq == 0) or last):
                metrics.update(self.validate(step))
            if self.budget and (over := self.budget.stop_line(time.time() - began)):
                stop.append(f"[budget] {over}; stopped")  # the step's time with its validation
            saved = (s.trainer.save_freq > 0 and step % s.trainer.save_freq == 0) or last or bool(stop)
            end = stop[-1] if stop and not last else ""
            if saved:
                self.save(step, metrics, last=last, stopped=end and f"{end} after step {step}")
            self.trackers.record(step, metrics, saved)
            self.log(progress_line(step, self.steps, metrics))
            if end:
                self.stopped = end[1 : end.index("]")]  # stop, or budget
                self.log(f"{end} after step {step}; checkpoint saved, resume goes on at step {step + 1}")
                return

    def shutdown(self, status: str = "FINISHED") -> None:
        import ray

        self.reward.close()
        self.trackers.close(status)
        if everyone := [*self.workers, *self.rollouts]:
            # no collective wait: after a failure, peers may sit in a collective with a dead one
            with contextlib.suppress(Exception):
                ray.wait([w.shutdown.remote() for w in everyone], num_returns=len(everyone), timeout=30)
        if ray.is_initialized():
            if self.spec.trainer.ray_timeline:  # Chrome trace of every Ray task (chrome://tracing)
                with contextlib.suppress(Exception):
                    ray.timeline(filename=self.spec.trainer.ray_timeline)
            ray.shutdown()


def _error(text, code: int) -> int:
    print(f"error: {text}", file=sys.stderr, flush=True)
    return code


def main(run_dir: str) -> int:
    try:
        trainer = Trainer(run_dir, launch_first=True)
    except (ValueError, FileNotFoundError) as e:  # bad data or files: say which, no traceback
        return _error(e, 2)
    except RunError as e:
        return _error(e, 1)
    from ray.exceptions import ActorDiedError, ActorUnavailableError, RayTaskError

    status = "FAILED"
    try:
        trainer.fit()
        status = "KILLED" if trainer.stopped else "FINISHED"
    except TrackerError as e:  # before the first step: a key or a setting to fix
        return _error(e, 2)
    except (RunError, DamagedCheckpoint) as e:
        return _error(e, 1)
    except (ActorDiedError, ActorUnavailableError, RayTaskError) as e:
        if cause := start_failure(e):  # nothing ran yet: the cause, and no resume to offer
            return _error(f"a {failed_pool(e, trainer.rollouts)} worker could not start: {cause}", 2)
        if isinstance(getattr(e, "cause", None), BadRow):  # an environment's reset failed on a row
            return _error(e.cause, 2)
        lost = worker_lost(e)
        if lost is None:  # a worker raised: a bug, worth its traceback
            raise
        return _error(
            f"a {failed_pool(e, trainer.rollouts)} worker died ({lost}); the job stops here and resumes from its last "
            "checkpoint when started again",
            1,
        )
    finally:
        trainer.shutdown(status)
    return EXIT if trainer.stopped == "budget" else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
