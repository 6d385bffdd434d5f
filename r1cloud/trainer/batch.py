"""The step's batch, as tensors from rollout to update (verl's DataProto, OpenRLHF's Experience):
row i is one sample. The driver fills it phase by phase (responses, scores, log-probs, advantages);
each worker gets its shard (`select`), with a plan of micro-batches as positions in that shard,
and returns tensors. Also how samples are placed on workers and cut into micro-batches (a group
kept together when its prompt is packed once), and the token rewards and advantages. Pure: no
Ray, no model.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, fields, replace

import torch

# the per-token (B, R) float fields, filled phase by phase
PER_TOKEN = ("rollout_logp", "old_logp", "ref_logp", "values", "advantages", "returns")


@dataclass
class Batch:
    uid: list[str]  # the group: samples with one uid answer one prompt (with its images)
    index: torch.Tensor  # (B,) the prompt's row in its set
    prompt_ids: torch.Tensor  # (B, P) right-padded
    prompt_len: torch.Tensor  # (B,)
    response_ids: torch.Tensor  # (B, R) right-padded
    response_len: torch.Tensor  # (B,)
    finished: torch.Tensor  # (B,) bool: ended on EOS, not cut at max_tokens
    loss_mask: torch.Tensor | None = None  # (B, R) the tokens the update trains on; None: all
    rollout_logp: torch.Tensor | None = None  # (B, R) fp32: the engine's sampling log-probs
    old_logp: torch.Tensor | None = None  # (B, R) fp32 under the actor before the update
    ref_logp: torch.Tensor | None = None  # (B, R) fp32 under the reference model
    values: torch.Tensor | None = None  # (B, R) fp32: GAE's critic estimates
    advantages: torch.Tensor | None = None  # (B, R) fp32, zero past each response
    returns: torch.Tensor | None = None  # (B, R) fp32: GAE's critic targets
    scores: dict[str, torch.Tensor] = field(default_factory=dict)  # (B,) fp64 per reward key
    episode: dict[str, torch.Tensor] = field(default_factory=dict)  # (B,) multi-turn counts (agents/)
    image_inputs: list[dict[str, torch.Tensor]] = field(
        default_factory=list
    )  # each prompt's processor tensors
    image_of: torch.Tensor | None = None  # (B,) index into image_inputs, -1 for none
    tool_images: list[dict[str, torch.Tensor]] | None = None  # (B,) each episode's observations' pictures

    def __len__(self) -> int:
        return len(self.uid)

    @property
    def response_mask(self) -> torch.Tensor:
        """(B, R) float: 1 on every response token."""
        width = self.response_ids.shape[1]
        return (
            torch.arange(width, device=self.response_len.device)[None, :] < self.response_len[:, None]
        ).float()

    @property
    def mask(self) -> torch.Tensor:
        """(B, R) float: the tokens the loss counts."""
        return self.response_mask if self.loss_mask is None else self.loss_mask.float()

    def to(self, device) -> Batch:
        """The lengths, loss mask and per-token fields on `device` (what an update computes with)."""
        names = ("response_len", "loss_mask", *PER_TOKEN)
        return replace(
            self, **{n: getattr(self, n).to(device) for n in names if getattr(self, n) is not None}
        )

    def select(self, idx, keep: tuple[str, ...] = PER_TOKEN) -> Batch:
        """Rows `idx` (in that order), cut to their longest prompt and response, with the
        per-token fields in `keep` (the others left out: what a call does not need, it is not sent)."""
        idx = torch.as_tensor(idx, dtype=torch.long)
        p = int(self.prompt_len[idx].max()) if len(idx) else 0
        r = int(self.response_len[idx].max()) if len(idx) else 0
        out = {}
        for f in fields(self):
            x = getattr(self, f.name)
            if f.name in ("uid", "tool_images") and x is not None:
                out[f.name] = [x[i] for i in idx.tolist()]
            elif f.name in ("image_inputs", "image_of"):
                continue
            elif f.name in ("scores", "episode"):
                out[f.name] = {k: v[idx] for k, v in x.items()}
            elif x is None or (f.name in PER_TOKEN and f.name not in keep):
                out[f.name] = None
            elif f.name == "prompt_ids":
                out[f.name] = x[idx, :p]
            elif x.dim() == 2:
                out[f.name] = x[idx, :r]
            else:
                out[f.name] = x[idx]
        if self.image_of is not None:
            used = self.image_of[idx]
            pictures = sorted({i for i in used.tolist() if i >= 0})
            where = {old: new for new, old in enumerate(pictures)}
            out["image_inputs"] = [self.image_inputs[i] for i in pictures]
            out["image_of"] = torch.tensor([where.get(i, -1) for i in used.tolist()], dtype=torch.long)
        return Batch(**out)

    def seqs(self, idx: list[int] | None = None) -> list[tuple]:
        """The rows as model.pack takes them: (prompt ids, response ids[, {"key": uid, **image_inputs}])."""
        idx = range(len(self)) if idx is None else idx
        plen, rlen = self.prompt_len.tolist(), self.response_len.tolist()
        out = []
        for i in idx:
            seq = (self.prompt_ids[i, : plen[i]].tolist(), self.response_ids[i, : rlen[i]].tolist())
            mm = {}
            if self.image_of is not None and self.image_of[i] >= 0:
                mm = {"key": self.uid[i], **self.image_inputs[int(self.image_of[i])]}
            if self.tool_images is not None and self.tool_images[i]:  # pictures inside the response
                mm = {"key": self.uid[i], **mm, "after": self.tool_images[i]}
            out.append((*seq, mm) if mm else seq)
        return out

    @classmethod
    def cat(cls, parts: list[Batch]) -> Batch:
        """One batch of several (a step's rounds), padded to the widest."""
        if len(parts) == 1:
            return parts[0]
        out = {"uid": [u for b in parts for u in b.uid]}
        for f in fields(cls):
            xs = [getattr(b, f.name) for b in parts]
            if f.name in ("uid", "image_inputs", "image_of"):
                continue
            if f.name == "tool_images":
                out[f.name] = None if all(x is None for x in xs) else [
                    t for x, b in zip(xs, parts, strict=True) for t in (x or [{}] * len(b))
                ]  # fmt: skip
                continue
            if f.name in ("scores", "episode"):
                keys = sorted({k for x in xs for k in x})
                out[f.name] = {
                    k: torch.cat([x.get(k, torch.zeros(len(b), dtype=torch.float64)) for x, b in zip(xs, parts, strict=True)])
                    for k in keys
                }  # fmt: skip
            elif any(x is None for x in xs):
                out[f.name] = None
            elif xs[0].dim() == 2:
                out[f.name] = pad_cat(xs)
            else:
                out[f.name] = torch.cat(xs)
        if any(b.image_of is not None for b in parts):  # a round of text rows has none (mixed data)
            base, inputs, of = 0, [], []
            for b in parts:
                mine = b.image_of if b.image_of is not None else torch.full((len(b),), -1)
                inputs += b.image_inputs or []
                of.append(torch.where(mine >= 0, mine + base, -1))
                base += len(b.image_inputs or [])
            out["image_inputs"], out["image_of"] = inputs, torch.cat(of)
        return cls(**out)

    def with_(self, **changes) -> Batch:
        return replace(self, **changes)

    # Across Ray a batch travels packed: per-token fields as their response tokens end to end (no
    # padding), and each group's prompt once. In memory it is padded, for vectorised math.
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        lengths = self.response_len
        for name in ("response_ids", "loss_mask", *PER_TOKEN):
            if state[name] is not None:
                state[name] = packed(state[name], lengths)
        first = list({u: i for i, u in reversed(list(enumerate(self.uid)))}.values())[::-1]
        at = {self.uid[i]: k for k, i in enumerate(first)}
        state["prompt_ids"] = packed(self.prompt_ids[first], self.prompt_len[first])
        state["prompt_of"] = torch.tensor([at[u] for u in self.uid], dtype=torch.long)
        return state

    def __setstate__(self, state: dict) -> None:
        lengths = state["response_len"]
        width = int(lengths.max()) if len(lengths) else 0
        for name in ("response_ids", "loss_mask", *PER_TOKEN):
            if state[name] is not None:
                state[name] = unpacked(state[name], lengths, width)
        of = state.pop("prompt_of")
        first = torch.zeros(int(of.max()) + 1 if len(of) else 0, dtype=torch.long)
        first[of] = torch.arange(len(of))
        plen = state["prompt_len"][first]
        state["prompt_ids"] = unpacked(state["prompt_ids"], plen, int(plen.max()) if len(plen) else 0)[of]
        self.__dict__.update(state)


def packed(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The first lengths[i] entries of each row of (B, W), end to end."""
    return x[torch.arange(x.shape[1])[None, :] < lengths[:, None]]


def unpacked(flat: torch.Tensor, lengths: torch.Tensor, width: int) -> torch.Tensor:
    """`packed`'s inverse: (B, width), zero past each row's length."""
    if not len(lengths) or not width:
        return flat.new_zeros(len(lengths), width)
    rows = torch.nn.utils.rnn.pad_sequence(torch.split(flat, lengths.tolist()), batch_first=True)
    return torch.nn.functional.pad(rows, (0, width - rows.shape[1]))


def decode(tokenizer, flat: torch.Tensor, lengths: list[int], skip: bool) -> list[str]:
    """Each response's text, as `tokenizer.decode` gives it. A fast tokenizer without clean-up
    (Qwen's, Llama 3's, SmolLM's) decodes the whole batch in one call of its Rust tokenizer:
    transformers' per-sequence decode spends more time checking the ids than decoding them."""
    rows = [r.tolist() for r in torch.split(flat, lengths)]
    fast = getattr(tokenizer, "_tokenizer", None)
    if fast is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return fast.decode_batch(rows, skip_special_tokens=skip)
    return tokenizer.batch_decode(rows, skip_special_tokens=skip)


def episode_fields(results: list[dict], lengths: torch.Tensor, width: int, stats: tuple[str, ...]) -> dict:
    """What multi-turn workers' results add to a batch: the loss mask, each episode's counts (and
    environment reward), and each episode's own prompt when its environment's reset added to it."""
    out = {
        "loss_mask": unpacked(torch.cat([r["mask"] for r in results]), lengths, width),
        "episode": {
            k: torch.cat([r["episode"][:, j] for r in results]).double() for j, k in enumerate(stats)
        },
    }
    if "env_reward" in results[0]:
        out["episode"]["env_reward"] = torch.cat([r["env_reward"] for r in results])
    if "prompt_ids" in results[0]:
        out["prompt_len"] = torch.cat([r["prompt_len"] for r in results])
        ids = torch.cat([r["prompt_ids"] for r in results])
        out["prompt_ids"] = unpacked(ids, out["prompt_len"], int(out["prompt_len"].max()))
    return out


def tool_images(results: list[dict]) -> list[dict] | None:
    """Each episode's observations' picture tensors ({} for none), when any episode has some."""
    if not any("tool_images" in r for r in results):
        return None
    return [t for r in results for t in r.get("tool_images", [{}] * len(r["length"]))]


def ragged(rows: list[list], dtype: torch.dtype, width: int | None = None) -> torch.Tensor:
    """Right-padded (len(rows), width) tensor of lists."""
    width = max((len(r) for r in rows), default=0) if width is None else width
    out = torch.zeros(len(rows), width, dtype=dtype)
    for i, r in enumerate(rows):
        if r:
            out[i, : len(r)] = torch.tensor(r, dtype=dtype)
    return out


def forward_rows(batch: Batch, micro_batches: list[list[int]], forward) -> torch.Tensor:
    """`forward(seqs)`'s per-sequence values for each micro-batch's rows, fp32, the shard's rows'
    response tokens end to end (batch.packed's layout)."""
    out: list = [None] * len(batch)
    for rows in micro_batches:
        for i, x in zip(rows, forward(batch.seqs(rows)), strict=True):
            out[i] = x.float().cpu()  # to the driver: host memory (what Ray's serializer sends)
    return torch.cat(out) if out else torch.zeros(0)


def pad_cat(parts: list[torch.Tensor]) -> torch.Tensor:
    """(Σ rows, widest) of several (rows, width) tensors, right-padded with zeros."""
    width = max((x.shape[1] for x in parts), default=0)
    return torch.cat([torch.nn.functional.pad(x, (0, width - x.shape[1])) for x in parts])


# ---------------------------------------------------------------------------- batching plans


@dataclass(frozen=True)
class Sizes:
    """What a plan knows of each sample: its group and its prompt and response lengths."""

    uid: list[str]
    prompt: list[int]
    response: list[int]

    @classmethod
    def of(cls, b: Batch) -> Sizes:
        return cls(b.uid, b.prompt_len.tolist(), b.response_len.tolist())


def balance(items: list, weights: list[float], parts: int) -> list[list]:
    """Greedy longest-first partition into `parts` groups of near-equal total weight."""
    heap = [(0.0, i) for i in range(parts)]
    out: list[list] = [[] for _ in range(parts)]
    for idx in sorted(range(len(items)), key=lambda i: -weights[i]):
        load, g = heapq.heappop(heap)
        out[g].append(items[idx])
        heapq.heappush(heap, (load + weights[idx], g))
    return out


def groups(s: Sizes, idx: list[int], share: bool) -> list[list[int]]:
    """The units a plan places: samples of one group together when the workers pack their prompt
    once (`share`), each sample alone otherwise."""
    if not share:
        return [[i] for i in idx]
    by_uid: dict[str, list[int]] = {}
    for i in idx:
        by_uid.setdefault(s.uid[i], []).append(i)
    return list(by_uid.values())


def cost(s: Sizes, group: list[int]) -> int:
    """Tokens a packed group takes: its prompt once (all share it, or it is alone), its responses."""
    return s.prompt[group[0]] + sum(s.response[i] for i in group)


def partition(s: Sizes, idx: list[int], parts: int, share: bool) -> list[list[int]]:
    """`parts` shares of near-equal token count. Groups stay whole where they can; while there are
    fewer groups than parts, the largest is halved."""
    units = groups(s, idx, share)
    while len(units) < parts and max(len(u) for u in units) > 1:
        big = max(units, key=len)
        units.remove(big)
        units += [big[: len(big) // 2], big[len(big) // 2 :]]
    return [[i for u in part for i in u] for part in balance(units, [cost(s, u) for u in units], parts)]


def micro_batches(
    s: Sizes, per_rank: list[list[int]], per_micro: int, token_budget: int | None, share: bool = False
) -> list[list[list[int]]]:
    """Split each rank's samples into the same number of non-empty micro-batches (FSDP's collectives
    must pair up): by sample count, or by token budget (dynamic batching)."""

    def need(idx: list[int]) -> int:
        if token_budget:
            return math.ceil(sum(cost(s, g) for g in groups(s, idx, share)) / token_budget)
        return math.ceil(len(idx) / per_micro)

    k = max(1, max(need(idx) for idx in per_rank))
    k = min(k, min(len(idx) for idx in per_rank))
    return [partition(s, idx, k, share) for idx in per_rank]


def split_ranks(s: Sizes, idx: list[int], world: int, share: bool = False) -> list[list[int]]:
    if len(idx) < world:
        raise ValueError(f"{len(idx)} samples cannot be spread over {world} workers")
    return partition(s, idx, world, share)


def rank_plan(
    s: Sizes, idx: list[int], world: int, per_micro: int, budget: int | None, share: bool, sp: int = 1
) -> list[list[list[int]]]:
    """Each rank's micro-batches of the samples `idx`: split over the data-parallel groups, the
    `sp` ranks of a Ulysses group given the same ones (they hold slices of one row)."""
    plan = micro_batches(s, split_ranks(s, idx, world // sp, share), per_micro, budget, share)
    return [micros for micros in plan for _ in range(sp)]


def localize(plan: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """A rank's micro-batches of batch rows as (the rows it needs, once each, in order; the
    micro-batches as positions in those rows): what it is sent."""
    rows = list(dict.fromkeys(i for micro in plan for i in micro))
    at = {i: k for k, i in enumerate(rows)}
    return rows, [[at[i] for i in micro] for micro in plan]


# ---------------------------------------------------------------------------- rewards, advantages


def token_rewards(
    scores: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor, kl: torch.Tensor | None, coef: float
) -> torch.Tensor:
    """Token-level rewards (B, T): the outcome on each response's last token, minus coef·KL on every
    token when the KL goes into the reward (verl's apply_kl_penalty)."""
    out = torch.zeros(mask.shape)
    if kl is not None:
        out = -coef * kl * mask
    rows = torch.nonzero(lengths > 0)[:, 0]
    out[rows, lengths[rows] - 1] += scores[rows].float()
    return out


class RunError(RuntimeError):
    """A mismatch of data, reward and settings found mid-run: said in one line, no traceback."""


def zero_copy_tensors() -> None:
    """Tensors through Ray as numpy views of their bytes, which Ray's pickle 5 sends out of band and
    a receiver on the same node maps from the object store without a copy. Ray's default pickles a
    tensor's storage in band: measured here, 100 MB took 0.38 s to put and 1.1 s to get, against
    0.05 s and 0.3 ms. Registered in the sending process (the driver, each worker); the receiver
    needs nothing. What arrives is read-only memory: nothing writes into a tensor it was sent."""
    import ray

    ray.util.register_serializer(torch.Tensor, serializer=_tensor_bytes, deserializer=_tensor_from)


def _tensor_bytes(t: torch.Tensor) -> tuple:
    t = t.detach().cpu().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy(), str(t.dtype).removeprefix("torch."), tuple(t.shape)


def _tensor_from(args: tuple) -> torch.Tensor:
    import warnings

    data, dtype, shape = args
    with warnings.catch_warnings():  # read-only: "The given NumPy array is not writable"
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(data).view(getattr(torch, dtype)).reshape(shape)
