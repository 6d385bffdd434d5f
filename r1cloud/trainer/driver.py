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
from pathlib import Path

import torch

from ..spec import Spec, load_resolved
from . import algorithms as alg
from . import rewards
from .batch import Rollout, RunError, advantages, micro_batches, reward_matrix, split_ranks, stats
from .checkpoint import Bucket, Checkpoints, read_state, write_hf_files
from .data import Loader, PromptSet, check_sets, chunk_evenly, load_tokenizer, total_steps
from .group import gather, launch, start_failure, worker_lost
from .metrics import actor_metrics, critic_metrics, forget_after, progress_line, rollout_metrics
from .model import pad
from .rollout import Request, pick_engine, refuse_unknown_sampling
from .sampling import for_rank
from .sampling import sampling as spec_sampling
from .trackers import TrackerError, Trackers, val_samples

# ---------------------------------------------------------------------------- the trainer


class Trainer:
    def __init__(self, run_dir: str | Path, spec: Spec | None = None):
        self.run_dir = Path(run_dir)
        self.spec = spec or load_resolved(self.run_dir / "spec.yaml")
        s = self.spec
        self.tokenizer, self.images = load_tokenizer(s.worker.actor.model, s.data)
        self.train_set = (
            PromptSet(
                s.data.train_files, self.tokenizer, s.data, probs=s.data.train_files_probs, images=self.images
            )
            if s.data.train_files
            else None
        )
        self.val_set = (
            PromptSet(s.data.val_files, self.tokenizer, s.data, images=self.images)
            if s.data.val_files
            else None
        )
        if (
            s.worker.rollout.enable_chunked_prefill
            and s.worker.rollout.name != "hf"
            and not torch.cuda.is_available()
        ):
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
        check_sets(sets, s.data, s.worker.rollout.limit_images, self.reward.wants, batch, self.log)
        self.loader = (
            Loader(len(self.train_set), batch, s.data.seed, s.data.shuffle)
            if self.train_set is not None
            else None
        )
        self.steps = total_steps(
            s.trainer.max_steps, s.trainer.total_epochs, self.loader.batches_per_epoch if self.loader else 0
        )
        ckpt_root = s.trainer.save_checkpoint_path or str(self.run_dir / "checkpoints")
        # a bucket URL: every worker writes its shards there directly (see Bucket)
        self.checkpoints = Bucket(ckpt_root) if "://" in ckpt_root else Checkpoints(ckpt_root)
        self.trackers = Trackers(s, self.run_dir, self.log, mirror=ckpt_root if "://" in ckpt_root else None)
        self.world = s.world_size
        self.kl_coef = s.algorithm.kl_coef
        self.workers: list = []
        self.share_prompts = False  # whether the workers pack a group's prompt once (start_workers)
        self.stopped = False  # a stop request ended the run early (fit)

    # ------------------------------------------------------------------ plumbing
    def log(self, text: str) -> None:
        print(text, flush=True)

    def call(self, method: str, *args, per_rank: list | None = None, **kwargs) -> list:
        if per_rank is not None:
            return gather(
                [
                    getattr(w, method).remote(a, *args, **kwargs)
                    for w, a in zip(self.workers, per_rank, strict=True)
                ]
            )
        return gather([getattr(w, method).remote(*args, **kwargs) for w in self.workers])

    def start_workers(self) -> str:
        self.workers = launch(self.spec, self.world)
        engine = pick_engine(self.spec.worker.rollout.name)
        self.share_prompts = self.call("shares_prompts")[0]
        self.adapter = self.call("adapter")[0]  # LoRA: adapter_config.json and what it trains
        refuse_unknown_sampling(engine, self.spec.worker.rollout.val_override_config)
        names = self.call("start_engine", engine)
        self.call("set_schedule", self.steps)
        return names[0]

    # ------------------------------------------------------------------ rollout
    def sampling(self, step: int, validation: bool = False, round: int = 0) -> dict:
        return spec_sampling(self.spec, step, validation, round)

    def generate(self, prompt_set: PromptSet, indices: list[int], sampling: dict) -> list[Rollout]:
        tp = self.spec.worker.rollout.tensor_parallel_size if self.engine == "vllm" else 1
        dp = self.world // tp
        chunks = chunk_evenly(indices, dp)
        uids = {i: uuid.uuid4().hex for i in indices}
        images = {}  # a prompt's image tensors, computed once for its rollout and its training
        for i in indices:
            if tensors := prompt_set.image_inputs(i):
                images[i] = {"key": uids[i], **tensors}
        requests = {}
        for i in indices:
            p = prompt_set.prompts[i]
            tensors = {k: v for k, v in images.get(i, {}).items() if k != "key"}
            requests[i] = Request(p.prompt_ids, p.raw_ids, p.images, tensors)
        per_rank, seeds = [], []
        for rank in range(self.world):
            chunk = chunks[rank // tp]
            per_rank.append([requests[i] for i in chunk])
            seeds.append(for_rank(sampling, rank // tp))
        results = gather(
            [w.generate.remote(p, s) for w, p, s in zip(self.workers, per_rank, seeds, strict=True)]
        )
        rollouts = []
        for rank in range(0, self.world, tp):
            chunk = chunks[rank // tp]
            for s in results[rank]:
                p = prompt_set.prompts[chunk[s["prompt"]]]
                rollouts.append(
                    Rollout(
                        p.index,
                        uids[p.index],
                        p.prompt_ids,
                        s["response"],
                        s["logprobs"],
                        s["finished"],
                        p.ground_truth,
                        source=p,
                        images=images.get(p.index),
                    )
                )
        return rollouts

    def score(self, rollouts: list[Rollout]) -> int:
        skip = self.spec.worker.reward.skip_special_tokens
        inputs = [
            rewards.reward_input(
                self.reward,
                self.tokenizer,
                r.source,
                self.tokenizer.decode(r.response, skip_special_tokens=skip),
                len(r.response),
                skip,
            )
            for r in rollouts
        ]
        scores, errors = self.reward(inputs)
        for r, s in zip(rollouts, scores, strict=True):
            r.scores = s
        return errors

    def forward(self, rollouts: list[Rollout], method: str, cfg, attr: str, **kwargs) -> None:
        """A forward-only pass over the batch on every worker (`log_probs` or `values`), in `cfg`'s
        experience micro-batches; each rollout's result is stored in `attr`."""
        budget = cfg.micro_batch_size_per_device_for_experience * (
            self.spec.data.max_prompt_length + self.spec.data.max_response_length
        )
        plan = micro_batches(
            split_ranks(rollouts, self.world, self.share_prompts),
            cfg.micro_batch_size_per_device_for_experience,
            budget if cfg.dynamic_batching else None,
            self.share_prompts,
        )
        results = self.call(
            method, per_rank=[[[r.seq for r in micro] for micro in micros] for micros in plan], **kwargs
        )
        for micros, res in zip(plan, results, strict=True):
            for micro, out in zip(micros, res, strict=True):
                for r, x in zip(micro, out, strict=True):
                    setattr(r, attr, x)

    def compute_log_probs(self, rollouts: list[Rollout], role: str) -> None:
        self.forward(
            rollouts, "log_probs", self.spec.worker.actor, "ref" if role == "ref" else "old", role=role
        )

    # ------------------------------------------------------------------ one step
    def make_batch(self, step: int) -> tuple[list[Rollout], list[Rollout], int, int]:
        """Generate and score until the step has `rollout_batch_size` groups (more than one round
        when `mini_rollout_batch_size` is smaller, or when dynamic sampling drops groups). Returns
        the kept rollouts, every rollout generated, the reward errors and the number of rounds."""
        s, a = self.spec, self.spec.algorithm
        kept: list[Rollout] = []
        seen: list[Rollout] = []
        errors = rounds = 0
        groups = 0
        while groups < s.data.rollout_batch_size:
            if 0 < s.trainer.max_try_make_batch <= rounds:
                raise RunError(
                    f"dynamic sampling: after {rounds} rounds only {groups} of {s.data.rollout_batch_size} "
                    f"groups had a mean {a.filter_key} strictly between algorithm.filter_low ({a.filter_low:g}) "
                    f"and algorithm.filter_high ({a.filter_high:g}); raise trainer.max_try_make_batch (≤ 0 "
                    "is unlimited), widen the filter, or use data nearer the model's level"
                )
            rounds += 1
            batch = self.generate(self.train_set, self.loader.next(), self.sampling(step, round=rounds - 1))
            errors += self.score(batch)
            seen += batch
            if a.online_filtering:
                keys = {k for r in batch for k in r.scores}
                if a.filter_key not in keys:
                    raise RunError(
                        f"algorithm.filter_key is {a.filter_key!r}, but the reward function returns "
                        f"{', '.join(sorted(keys))}; set filter_key to one of them"
                    )
                values = [r.scores.get(a.filter_key, 0.0) for r in batch]  # a failed sample scores 0
                keep = alg.groups_to_keep([r.uid for r in batch], values, a.filter_low, a.filter_high)
                batch = [r for r in batch if r.uid in keep]
            kept += batch
            groups = len({r.uid for r in kept})
        wanted = list(dict.fromkeys(r.uid for r in kept))[: s.data.rollout_batch_size]
        return [r for r in kept if r.uid in set(wanted)], seen, errors, rounds

    def greedy_baselines(self, rollouts: list[Rollout], step: int) -> torch.Tensor:
        """ReMax: each prompt's reward under greedy decoding (temperature 0, one sample)."""
        indices = list(dict.fromkeys(r.prompt for r in rollouts))
        greedy = self.generate(self.train_set, indices, {**self.sampling(step), "n": 1, "temperature": 0.0})
        self.score(greedy)
        by_prompt = {g.prompt: g.scores["overall"] for g in greedy}
        return torch.tensor([by_prompt[r.prompt] for r in rollouts], dtype=torch.float64)

    def train_step(self, step: int) -> dict:
        s, t0 = self.spec, time.perf_counter()
        a = s.algorithm
        timing: dict[str, float] = {}
        tick = time.perf_counter()
        rollouts, seen, errors, rounds = self.make_batch(step)
        timing["gen"] = time.perf_counter() - tick
        metrics: dict[str, float] = {}
        if a.adv_estimator == "remax":
            tick = time.perf_counter()
            baselines = self.greedy_baselines(rollouts, step)
            timing["gen_baseline"] = time.perf_counter() - tick
            metrics.update(stats("critic/baseline", baselines.tolist()))
        else:
            baselines = None

        n_mini = max(1, s.data.rollout_batch_size // s.worker.actor.global_batch_size)
        on_policy = s.worker.actor.ppo_epochs == 1 and n_mini == 1
        kl_in_reward = not a.disable_kl and not a.use_kl_loss
        if not on_policy or kl_in_reward:
            tick = time.perf_counter()
            self.compute_log_probs(rollouts, "actor")
            timing["old"] = time.perf_counter() - tick
        if not a.disable_kl:
            tick = time.perf_counter()
            self.compute_log_probs(rollouts, "ref")
            timing["ref"] = time.perf_counter() - tick
        if a.adv_estimator == "gae":
            tick = time.perf_counter()
            self.compute_values(rollouts)
            timing["values"] = time.perf_counter() - tick

        tick = time.perf_counter()
        scores = torch.tensor([r.scores["overall"] for r in rollouts], dtype=torch.float64)
        kl = None
        if kl_in_reward:
            kl = [alg.kl_estimate(torch.tensor(r.old), torch.tensor(r.ref), a.kl_penalty) for r in rollouts]
            sums = torch.tensor([float(k.sum()) for k in kl], dtype=torch.float64)
            per_token = sum(float(k.mean()) if len(k) else 0.0 for k in kl) / len(rollouts)
            metrics["actor/kl_penalty"] = per_token
            metrics["actor/kl_coef"] = self.kl_coef
            rewards = scores - self.kl_coef * sums
            token_rewards, mask = reward_matrix(rollouts, scores, kl, self.kl_coef)
            if a.kl_type == "adaptive":
                self.kl_coef = alg.adaptive_kl_coef(
                    self.kl_coef, per_token, a.kl_target, len(rollouts), a.kl_horizon
                )
        else:
            rewards = scores
            token_rewards, mask = reward_matrix(rollouts, scores, None, 0.0)
        values = (
            pad([r.values for r in rollouts], width=mask.shape[1])[0] if a.adv_estimator == "gae" else None
        )
        adv, returns = advantages(a, rollouts, rewards, token_rewards, mask, values, baselines)
        for i, r in enumerate(rollouts):
            r.adv = adv[i]
            r.returns = returns[i] if returns is not None else None
            if on_policy and not s.worker.actor.rollout_is:
                r.old = None
        metrics.update(stats("critic/rewards", rewards.tolist()))
        timing["adv"] = time.perf_counter() - tick

        if a.adv_estimator == "gae":
            tick = time.perf_counter()
            metrics.update(self.update_critic(rollouts))
            timing["update_critic"] = time.perf_counter() - tick
        if step > s.trainer.critic_warmup:
            tick = time.perf_counter()
            metrics.update(self.update(rollouts, n_mini))
            timing["update_actor"] = time.perf_counter() - tick
            tick = time.perf_counter()
            self.call("sync_weights")
            timing["sync"] = time.perf_counter() - tick
        timing["step"] = time.perf_counter() - t0

        metrics.update(rollout_metrics(seen, rollouts, errors, s.data.max_prompt_length))
        if a.online_filtering or s.data.mini_rollout_batch_size:
            metrics["batch/rounds"] = rounds
            metrics["batch/kept_groups_ratio"] = len({r.uid for r in rollouts}) / len({r.uid for r in seen})
        metrics.update({f"timing_s/{k}": v for k, v in timing.items()})
        metrics["perf/old_log_prob_recomputed"] = 0.0 if on_policy and not kl_in_reward else 1.0
        tokens = sum(len(r.prompt_ids) + len(r.response) for r in rollouts)
        metrics["perf/total_num_tokens"] = tokens
        metrics["perf/time_per_step"] = timing["step"]
        metrics["perf/throughput"] = tokens / (timing["step"] * self.world)
        if a.use_kl_loss and not a.disable_kl:
            metrics["actor/kl_coef"] = self.kl_coef
        return metrics

    def payloads(self, rollouts: list[Rollout], n_mini: int, role, sample) -> tuple[list[list[dict]], int]:
        """What each rank's `update`/`update_critic` gets: per optimizer step, its micro-batches of
        `sample(rollout)` dicts and the mini-batch's global token (or non-empty sequence) count
        that `aggregate` divides by. Also the number of optimizer steps."""
        budget = role.micro_batch_size_per_device_for_update * (
            self.spec.data.max_prompt_length + self.spec.data.max_response_length
        )
        plans = []
        for _ in range(role.ppo_epochs):
            for mini in chunk_evenly(rollouts, n_mini):
                total = (
                    sum(len(r.response) for r in mini)
                    if alg.AGG_MODES[role.loss_avg_mode] == "token-mean"
                    else sum(1 for r in mini if r.response)
                )
                plan = micro_batches(
                    split_ranks(mini, self.world, self.share_prompts),
                    role.micro_batch_size_per_device_for_update,
                    budget if role.dynamic_batching else None,
                    self.share_prompts,
                )
                plans.append((plan, max(total, 1)))
        per_rank = [
            [
                {"total": total, "micro": [[sample(r) for r in micro] for micro in plan[rank]]}
                for plan, total in plans
            ]
            for rank in range(self.world)
        ]
        return per_rank, len(plans)

    def compute_values(self, rollouts: list[Rollout]) -> None:
        self.forward(rollouts, "values", self.spec.worker.critic, "values")

    def update_critic(self, rollouts: list[Rollout]) -> dict[str, float]:
        c = self.spec.worker.critic
        per_rank, steps = self.payloads(
            rollouts,
            max(1, self.spec.data.rollout_batch_size // c.global_batch_size),
            c,
            lambda r: {"seq": r.seq, "values": r.values, "returns": r.returns},
        )
        results = self.call("update_critic", per_rank=per_rank)
        return critic_metrics(results, steps, rollouts)

    def update(self, rollouts: list[Rollout], n_mini: int) -> dict[str, float]:
        s = self.spec
        tis = s.worker.actor.rollout_is
        per_rank, steps = self.payloads(
            rollouts,
            n_mini,
            s.worker.actor,
            lambda r: (
                {"seq": r.seq, "old": r.old, "ref": r.ref, "adv": r.adv}
                | ({"rollout": r.logprobs} if tis else {})
            ),
        )
        results = self.call("update", per_rank=per_rank)
        return actor_metrics(results, steps, tis, s.algorithm.use_kl_loss and not s.algorithm.disable_kl)

    # ------------------------------------------------------------------ validation
    def validate(self, step: int) -> dict[str, float]:
        tick = time.perf_counter()
        indices = list(range(len(self.val_set)))
        size = self.spec.data.val_batch_size if self.spec.data.val_batch_size > 0 else len(indices)
        rollouts: list[Rollout] = []
        for start in range(0, len(indices), size):
            batch = self.generate(
                self.val_set, indices[start : start + size], self.sampling(step, validation=True)
            )
            self.score(batch)
            rollouts += batch
        keys = sorted({k for r in rollouts for k in r.scores})
        m = {f"val/{k}_reward": sum(r.scores.get(k, 0.0) for r in rollouts) / len(rollouts) for k in keys}
        m["val/reward_score"] = m["val/overall_reward"]
        m.update(stats("val_response_length", [float(len(r.response)) for r in rollouts]))
        m["timing_s/validation"] = time.perf_counter() - tick
        k = self.spec.trainer.val_generations_to_log
        self.trackers.generations(step, val_samples(rollouts, self.tokenizer, k))
        return m

    # ------------------------------------------------------------------ checkpoints
    def save(self, step: int, metrics: dict, last: bool = False) -> None:
        tick = time.perf_counter()
        where = self.checkpoints.begin(step)
        only = self.spec.trainer.save_model_only
        self.call("save", f"{where}/actor", model_only=only)
        if self.spec.algorithm.adv_estimator == "gae":
            self.call("save", f"{where}/critic", role="critic", model_only=only)
        saver = self.images or self.tokenizer  # a VLM's processor files carry its tokenizer
        write_hf_files(
            self.checkpoints,
            where,
            self.spec.worker.actor.model,
            saver,
            self.run_dir,
            last and self.spec.trainer.save_hf,
            self.adapter and self.adapter["config"],
        )
        state = {
            "step": step,
            "loader": self.loader.state_dict(),
            "scheduler": self.call("scheduler_state")[0],
            "critic_scheduler": self.call("scheduler_state", role="critic")[0],
            "kl_coef": self.kl_coef,
            "metrics": metrics,
            "world_size": self.world,
            "model_only": only,
        }
        self.checkpoints.publish(where, step, state, metrics.get("val/reward_score"))
        self.checkpoints.prune(self.spec.trainer.save_limit)
        metrics["timing_s/save_checkpoint"] = time.perf_counter() - tick

    def resume(self) -> int:
        s = self.spec.trainer
        found = None
        if s.load_checkpoint_path:
            path = s.load_checkpoint_path.rstrip("/")
            found = (read_state(path)["step"], path)
        elif s.find_last_checkpoint:
            found = self.checkpoints.latest()
        if not found:
            return 0
        step, path = found
        state = read_state(path)
        optimizer = not state.get("model_only")
        self.call("load", f"{path}/actor", state.get("scheduler"), optimizer=optimizer)
        if self.spec.algorithm.adv_estimator == "gae" and state.get("critic_scheduler") is not None:
            self.call(
                "load", f"{path}/critic", state.get("critic_scheduler"), role="critic", optimizer=optimizer
            )
        self.kl_coef = state.get("kl_coef", self.kl_coef)
        self.loader.load_state_dict(state["loader"])
        fresh = "" if optimizer else "; model only (trainer.save_model_only): the optimizer starts afresh"
        self.log(
            f"[resume] from step {step} ({path}), saved with {state.get('world_size')} workers, now {self.world}{fresh}"
        )
        return step

    # ------------------------------------------------------------------ the loop
    def fit(self) -> None:
        s = self.spec
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.trackers.start()  # before the workers: a tracker that cannot start costs no model load
        self.engine = self.start_workers()
        stop = []  # after ray.init, which installs its own SIGTERM handler
        signal.signal(signal.SIGTERM, lambda *_: stop.append(True))  # finish the step, save, exit
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
        (self.run_dir / "trainer.json").write_text(
            json.dumps(
                {
                    "total_steps": self.steps,
                    "engine": self.engine,
                    "workers": self.world,
                    "resumed_from": start,
                }
            )
        )
        self.call("sync_weights")
        if self.val_set and (s.trainer.val_only or (s.trainer.val_before_train and start == 0)):
            m = self.validate(start)
            self.trackers.record(start, m)
            self.log(f"[val] step {start}: reward {m['val/reward_score']:.3f}")
            if s.trainer.val_only:
                return
        for step in range(start + 1, self.steps + 1):
            metrics = self.train_step(step)
            last = step == self.steps
            if self.val_set and ((s.trainer.val_freq > 0 and step % s.trainer.val_freq == 0) or last):
                metrics.update(self.validate(step))
            saved = (s.trainer.save_freq > 0 and step % s.trainer.save_freq == 0) or last or bool(stop)
            if saved:
                self.save(step, metrics, last=last)
            self.trackers.record(step, metrics, saved)
            self.log(progress_line(step, self.steps, metrics))
            if stop and not last:
                self.log(
                    f"[stop] stopped after step {step}; checkpoint saved, resume continues at step {step + 1}"
                )
                self.stopped = True
                return

    def shutdown(self, status: str = "FINISHED") -> None:
        import ray

        self.reward.close()
        self.trackers.close(status)
        if self.workers:
            # no collective wait: after a failure, peers may sit in a collective with a dead one
            with contextlib.suppress(Exception):
                ray.wait(
                    [w.shutdown.remote() for w in self.workers], num_returns=len(self.workers), timeout=30
                )
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
        trainer = Trainer(run_dir)
    except (ValueError, FileNotFoundError) as e:  # bad data or files: say which, no traceback
        return _error(e, 2)
    from ray.exceptions import ActorDiedError, ActorUnavailableError, RayTaskError

    status = "FAILED"
    try:
        trainer.fit()
        status = "KILLED" if trainer.stopped else "FINISHED"
    except TrackerError as e:  # before the first step: a key or a setting to fix
        return _error(e, 2)
    except RunError as e:
        return _error(e, 1)
    except (ActorDiedError, ActorUnavailableError, RayTaskError) as e:
        if cause := start_failure(e):  # nothing ran yet: the cause, and no resume to offer
            return _error(f"a trainer worker could not start: {cause}", 2)
        lost = worker_lost(e)
        if lost is None:  # a worker raised: a bug, worth its traceback
            raise
        return _error(
            f"a trainer worker died ({lost}); the job stops here and resumes from its last checkpoint "
            "when started again",
            1,
        )
    finally:
        trainer.shutdown(status)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
