"""The step's batch, as tensors from rollout to update (verl's DataProto, OpenRLHF's Experience):
row i is one sample. The driver fills it phase by phase (responses, scores, log-probs, advantages);
each worker gets its shard (`select`), with a plan of micro-batches as positions in that shard,
and returns tensors (placement.py says which rows go where). Pure: no Ray, no model.
"""

from __future__ import annotations

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
    # each prompt's processor tensors
    image_inputs: list[dict[str, torch.Tensor]] = field(default_factory=list)
    image_of: torch.Tensor | None = None  # (B,) index into image_inputs, -1 for none
    tool_images: list[dict[str, torch.Tensor]] | None = None  # (B,) each episode's observations' pictures
    version: torch.Tensor | None = None  # (B,) asynchronous: the updates in the weights that sampled it

    def __len__(self) -> int:
        return len(self.uid)

    @property
    def response_mask(self) -> torch.Tensor:
        """(B, R) float: 1 on every response token."""
        at = torch.arange(self.response_ids.shape[1], device=self.response_len.device)
        return (at[None, :] < self.response_len[:, None]).float()

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
            elif xs[0].dim() == 2:  # right-padded with zeros to the widest
                width = max(x.shape[1] for x in xs)
                out[f.name] = torch.cat([torch.nn.functional.pad(x, (0, width - x.shape[1])) for x in xs])
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
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    width = max(lengths.tolist(), default=0) if width is None else width
    return unpacked(torch.tensor([x for r in rows for x in r], dtype=dtype), lengths, width)


def forward_rows(batch: Batch, micro_batches: list[list[int]], forward) -> torch.Tensor:
    """`forward(seqs)`'s per-sequence values for each micro-batch's rows, fp32, the shard's rows'
    response tokens end to end (batch.packed's layout)."""
    out: list = [None] * len(batch)
    for rows in micro_batches:
        for i, x in zip(rows, forward(batch.seqs(rows)), strict=True):
            out[i] = x.float().cpu()  # to the driver: host memory (what Ray's serializer sends)
    return torch.cat(out) if out else torch.zeros(0)
