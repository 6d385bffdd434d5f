"""Model-side tensor work: padding-free packing and log-probs of response tokens.

Packing puts a micro-batch's sequences end to end in one row with position ids restarting at 0
per sequence and `attention_mask=None, use_cache=False`: transformers then builds a block-diagonal
causal mask (sdpa/eager on CPU, varlen flash-attention on GPU). With a cache or a 2-D mask it
silently lets sequences attend across boundaries (reference §4), hence both are forced here.
Only the positions that predict response tokens go through the LM head (`logits_to_keep`).

A model loaded with attention.py's implementation (the workers load theirs so where the model
allows) attends segment by segment instead of through an N×N mask, and its prompts are shared:
sequences with the same prompt (a GRPO group) hold one copy of it, each response following it
with positions continuing from its end and attending to that prompt and to itself only. A causal
model computes a prompt's states without looking past it, so every log-prob is the one a copy
per sequence gives, and the backward pass sums the group's gradients through the one copy.
"""

from __future__ import annotations

import copy
import dataclasses
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import partial

import torch

from r1cloud.media import vision
from r1cloud.media.vision import uses_mrope
from r1cloud.trainer import ulysses
from r1cloud.trainer.attention import NAME, Segments, register
from r1cloud.trainer.batch import unpacked
from r1cloud.trainer.head import head_log_probs, scaled

# model types whose logits are exactly the last hidden states times the output weight (no
# soft-capping, scaling or bias after it): their log-probs skip the full logits (head.py)
PLAIN_HEADS = {
    "llama", "mistral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3",
    "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "idefics3", "smolvlm",
}  # fmt: skip


@dataclass
class Packed:
    input_ids: torch.Tensor  # (1, N)
    position_ids: torch.Tensor  # (1, N), or (4, 1, N) with mRoPE: the text row, then t/h/w
    keep: torch.Tensor  # (Σ resp,) positions whose logits predict a response token, in input order
    targets: torch.Tensor  # (Σ resp,) those response tokens
    lengths: list[int]  # response length per sequence
    segments: Segments | None  # with share_prompts: what each token attends to
    image_inputs: dict[str, torch.Tensor] = field(default_factory=dict)  # each laid-out prompt's, in order
    sp: ulysses.Group | None = None  # a slice of the row, for this Ulysses group (`_slice`)


# A sequence: (prompt ids, response ids) or, with images, (prompt ids, response ids, inputs) where
# inputs = {"key": the prompt's identity, **the processor's image tensors} (media/vision.py)
Seq = tuple


def pack(
    seqs: list[Seq],
    device: str | torch.device = "cpu",
    share_prompts: bool = False,
    rope=None,
    multiple: int = 1,
) -> Packed:
    """One padding-free row. `rope(prompt_ids, images) -> ((3, P) positions, delta)` gives a
    Qwen-VL prompt's mRoPE positions; its response tokens then continue at text position + delta
    on all three axes (what get_rope_index gives a text token after the last image). An episode
    whose observations hold pictures (inputs["after"]) has them laid out after its prompt's, in
    token order, and its response's positions from the whole sequence."""
    families: dict[tuple, list[int]] = {}  # one laid-out prompt → the sequences that follow it
    for i, s in enumerate(seqs):
        key = (tuple(s[0]), _images(s).get("key")) if share_prompts else (i,)
        families.setdefault(key, []).append(i)
    ids: list[int] = []
    pos: list[int] = []
    mrope: list[torch.Tensor] = []
    images: list[dict] = []
    segments: list[tuple[list[int], list[int]]] = []  # (query tokens, the prompt's tokens before them)
    keep: list[list[int]] = [[] for _ in seqs]
    for members in families.values():
        prompt, mm = seqs[members[0]][0], _images(seqs[members[0]])
        prompt_images = {k: v for k, v in mm.items() if k not in ("key", "after")}
        images.append(prompt_images)
        start = len(ids)
        shared = list(range(start, start + len(prompt)))
        ids += prompt
        pos += range(len(prompt))
        if rope is not None:
            at, delta = rope(prompt, images[-1])
            mrope.append(at)
        if len(members) > 1:
            segments.append((shared, []))
        for i in members:
            response, later = seqs[i][1], _images(seqs[i]).get("after")
            own = list(range(len(ids), len(ids) + len(response)))
            keep[i] = [shared[-1], *own[:-1]][: len(response)]  # the token before each response token
            ids += response
            pos += range(len(prompt), len(prompt) + len(response))
            if later:
                images.append(later)
            if rope is not None and later:  # pictures in the response: positions of the whole episode
                whole = vision.merge([prompt_images, later])
                mrope.append(rope(prompt + response, whole)[0][:, len(prompt) :])
            elif rope is not None:
                after = torch.arange(len(prompt), len(prompt) + len(response)) + delta
                mrope.append(after.expand(3, -1))
            segments.append((own, shared) if len(members) > 1 else (shared + own, []))

    if len(ids) % multiple:  # Ulysses: a row that splits evenly, padded with a segment of its own
        extra = multiple - len(ids) % multiple
        segments.append((list(range(len(ids), len(ids) + extra)), []))
        ids, pos = ids + [0] * extra, pos + list(range(extra))
        if rope is not None:
            mrope.append(torch.arange(extra).expand(3, -1))

    def t(x):
        return torch.tensor(x, dtype=torch.long, device=device)

    position_ids = t(pos)[None]
    if rope is not None:  # (4, 1, N): row 0 restarts per sequence, so the model masks by sequence
        position_ids = torch.cat([position_ids, torch.cat(mrope, dim=1).to(device)])[:, None]
    return Packed(
        t(ids)[None],
        position_ids,
        t([x for k in keep for x in k]),
        t([x for _, r, *_ in seqs for x in r]),
        [len(s[1]) for s in seqs],
        Segments.build(segments, pos, device) if share_prompts else None,
        {k: v.to(device) for k, v in vision.merge(images).items()},
    )


BLANK = "r1cloud-blank"  # the key of a model's blank picture (blank_sequence)


def blank_sequence(model_cfg, data_cfg) -> Seq:
    """A VLM's smallest sequence with a picture: a user turn holding one blank square, then one
    response token. Set on a sharded VLM as `model.r1cloud_blank`, it joins every micro-batch that
    has no picture (`_with_tower`), so the vision tower runs on every worker each time and FSDP's
    collectives pair up between workers whose micro-batches differ (text-only rows among image
    rows). It attends only to itself and adds 0 × its log-prob to the first sequence's: no number
    changes, and the tower's gradient (zero) is reduced on every worker."""
    from PIL import Image

    from r1cloud.data.loader import load_tokenizer

    _, images = load_tokenizer(model_cfg, data_cfg)
    enc = images.encode(images.render(vision.PLACEHOLDER, True), [Image.new("RGB", (56, 56))])
    return (enc.ids, enc.ids[-1:], {"key": BLANK, **enc.image_inputs})


def _slice(p: Packed, sp):
    """The part of the packed row this worker runs (all of it without sequence parallelism), and
    how its per-response-token values become the whole row's (ulysses.py)."""
    if sp is None:
        return p, lambda x: x
    if p.segments is None:
        raise RuntimeError(
            "ulysses_size > 1 needs a model whose attention r1cloud plugs into (attention.py); "
            "set ulysses_size: 1"
        )
    n = p.input_ids.shape[1] // sp.size
    lo, hi = sp.rank * n, (sp.rank + 1) * n
    mine = (p.keep >= lo) & (p.keep < hi)
    # a VLM takes the whole row and slices it after embedding it (ulysses.sliced_language_model)
    cut = (
        {}
        if p.image_inputs
        else {"input_ids": p.input_ids[:, lo:hi], "position_ids": p.position_ids[..., lo:hi]}
    )
    local = dataclasses.replace(p, **cut, keep=p.keep[mine] - lo, targets=p.targets[mine], sp=sp)
    return local, lambda x: ulysses.gathered(x, mine, sp)


def _with_tower(model, seqs: list[Seq]) -> list[Seq]:
    blank = getattr(model, "r1cloud_blank", None)
    return [*seqs, blank] if blank is not None and not any(_images(s) for s in seqs) else seqs


def _fold(values: list[torch.Tensor], n: int) -> list[torch.Tensor]:
    """The first `n` sequences' values; a blank's (see blank_sequence) enters the first × 0."""
    if len(values) == n:
        return values
    return [values[0] + 0.0 * values[n].sum(), *values[1:n]]


def _images(seq: Seq) -> dict:
    return (seq[2] if len(seq) > 2 else None) or {}


def rope_index(model):
    """`pack`'s rope for a Qwen-VL model (mRoPE), else None."""
    if not uses_mrope(model):
        return None
    get, config = model.model.get_rope_index, model.config
    grids = ("image_grid_thw", "video_grid_thw", "second_per_grid_ts")
    qwen2 = config.model_type in vision.QWEN2_ROPE  # Qwen's own rule (vision.qwen2_rope_index)

    def rope(prompt: list[int], images: dict) -> tuple[torch.Tensor, int]:
        if "image_grid_thw" not in images and "video_grid_thw" not in images:  # a text prompt
            return torch.arange(len(prompt)).expand(3, -1), 0
        ids = torch.tensor(prompt)[None]
        given = {k: images[k].cpu() for k in grids if k in images}
        if qwen2:
            return vision.qwen2_rope_index(config, vision.token_types(config, ids).tolist(), **given)[0]
        at, delta = get(ids, vision.token_types(config, ids), **given)
        return at[:, 0].cpu(), int(delta.reshape(-1)[0])

    return rope


def attention_for(config):
    """attention.py for the language model; a vision tower keeps sdpa (its images are not packed
    by segments, and it is told each image's extent itself)."""
    name = register()
    if vision.is_vision_config(config):
        return {"": name, "text_config": name, "vision_config": "sdpa"}
    return name


def load_weights(load, path: str, config, kwargs: dict, empty: bool):
    """The model at `path` through `load` (an Auto class), with packed-segment attention where the
    model's attention is pluggable; with `empty`, the same model on the meta device, weightless,
    for rank 0 to fill (receive_from_rank0)."""
    make = partial(load.from_pretrained, path, **kwargs)
    if empty:
        config = copy.deepcopy(kwargs.get("config", config))
        for key, value in kwargs.items():  # what from_pretrained would set on the config
            if key not in ("dtype", "trust_remote_code", "config"):
                setattr(config, key, value)
        trust = kwargs.get("trust_remote_code", False)
        make = partial(load.from_config, config, dtype=kwargs["dtype"], trust_remote_code=trust)
    with torch.device("meta") if empty else nullcontext():
        try:
            return make(attn_implementation=kwargs.get("attn_implementation") or attention_for(config))
        except (ValueError, NotImplementedError):
            return make()


def receive_from_rank0(model, full: dict, empty: bool, device: str) -> None:
    """After sharding: rank 0's weights (`full`, taken before it sharded) into every worker's shards;
    buffers (rotary tables, which no state dict holds) copied whole."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if empty:
        model.to_empty(device=device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full, options=options)
    for buffer in model.buffers():
        dist.broadcast(buffer, src=0)


def vision_tower(model):
    """The vision encoder (with its projector where the model keeps it inside), or None."""
    inner = getattr(model, "model", model)
    for name in ("visual", "vision_model", "vision_tower"):
        if isinstance(getattr(inner, name, None), torch.nn.Module):
            return getattr(inner, name)
    return None


def language_model(model) -> list[torch.nn.Module]:
    """A VLM's language model: its decoder (with the word embeddings) and its output layer."""
    return [model.get_decoder(), model.get_output_embeddings()]


def shard_units(model) -> list[torch.nn.Module]:
    """The modules FSDP shards one by one: every instance of the model's `_no_split_modules`
    (decoder layers, vision blocks), outermost first."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    units = [m for m in model.modules() if type(m).__name__ in names]
    inside = {id(c) for u in units for c in u.modules() if c is not u}
    return [u for u in units if id(u) not in inside]


def apply_fsdp(units: list, shard: dict) -> None:
    """FSDP2 on each unit, the root (the whole model) last. head.py reads the output layer's weight
    after the forward pass, so the root's parameters (embeddings, final norm, output layer) stay
    gathered until the backward pass reshards them: a root resharded after its forward pass (as
    reshard_after_forward=True asks, on GPUs) hands head.py a DTensor."""
    from torch.distributed.fsdp import fully_shard

    for module in units[:-1]:
        fully_shard(module, **shard)
    fully_shard(units[-1], **{**shard, "reshard_after_forward": False})


@contextmanager
def resharded(model, cuda: bool):
    """A forward pass with no backward after it, the root's parameters sharded again at its end:
    on GPUs, where apply_fsdp keeps them gathered for head.py until a backward pass, which a
    reference model never runs (its embeddings and output layer would stay whole for the run)."""
    try:
        yield
    finally:
        if cuda and hasattr(model, "reshard"):  # an FSDP module
            model.reshard()


def uses_segments(model) -> bool:
    """Whether the model attends through attention.py (then its prompts can be shared)."""
    return getattr(model.config, "_attn_implementation", None) == NAME


def _forward(model, p: Packed, **kwargs):
    extra = {"r1cloud_segments": p.segments} if p.segments is not None else {}
    extra.update({"r1cloud_sp": p.sp} if p.sp is not None else {})
    extra.update(p.image_inputs)
    sliced = ulysses.sliced_language_model(model, p.sp) if p.sp and p.image_inputs else nullcontext()
    with sliced:
        return model(
            input_ids=p.input_ids,
            position_ids=p.position_ids,
            attention_mask=None,
            use_cache=False,
            **extra,
            **kwargs,
        )


def plain_head(model) -> torch.nn.Module | None:
    """The output layer when its logits can go through head.py, else None."""
    head = model.get_output_embeddings()
    plain = model.config.model_type in PLAIN_HEADS and getattr(head, "bias", None) is None
    return head if plain and isinstance(head, torch.nn.Linear) else None


@contextmanager
def _hidden_states_out(head: torch.nn.Module):
    """The model returns its last hidden states (at `logits_to_keep`) where it would return logits.
    Its forward still runs whole, so FSDP's hooks on the root module gather and reduce as usual."""
    head.forward = lambda hidden: hidden  # shadows the class's forward for this call only
    try:
        yield
    finally:
        del head.forward


def token_log_probs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / T)[target], in fp32, without materialising the full log-softmax."""
    logits = scaled(logits, temperature)
    return logits.gather(-1, targets[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0, chunk: int = 1024) -> torch.Tensor:
    """Entropy of softmax(logits / T) per row: logsumexp(z) − Σ softmax(z)·z, in fp32 chunks of
    rows so only one chunk's full-vocabulary softmax exists at a time."""
    out = []
    for part in torch.split(logits, chunk):
        z = scaled(part, temperature)
        out.append(torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(-1))
    return torch.cat(out) if out else logits.new_zeros(0, dtype=torch.float32)


def packed_log_probs(
    model,
    seqs: list[Seq],
    temperature: float,
    device="cpu",
    entropy: bool = False,
    entropy_grad: bool = False,
    sp=None,
):
    """Per-sequence log-probs of the response tokens under `model` (grad flows if enabled); with
    `entropy`, also the per-token entropy of the sampling distribution: (log-probs, entropies).
    The entropy carries a gradient only with `entropy_grad` (an entropy bonus): otherwise its
    full-vocabulary softmax would be kept for the backward pass for nothing. A model attending
    through attention.py gets each prompt once. `sp`: this worker's Ulysses group (ulysses.py)."""
    n, seqs = len(seqs), _with_tower(model, seqs)
    p = pack(seqs, device, uses_segments(model), rope_index(model), sp.size if sp else 1)
    mine, whole = _slice(p, sp)
    head = plain_head(model)
    if head is not None:
        with _hidden_states_out(head):
            hidden = _forward(model, mine, logits_to_keep=mine.keep).logits[0]
        # read after the forward pass: under FSDP the head's weight is then the gathered one
        logp, ent = head_log_probs(hidden, head.weight, mine.targets, temperature, entropy_grad)
        logp, ent = whole(logp), whole(ent)
    else:
        out = _forward(model, mine, logits_to_keep=mine.keep)
        logp = whole(token_log_probs(out.logits[0], mine.targets, temperature))
        if entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                ent = whole(entropy_from_logits(out.logits[0], temperature))
    logp = _fold(list(torch.split(logp, p.lengths)), n)
    return (logp, list(torch.split(ent, p.lengths))[:n]) if entropy else logp


def packed_values(critic, seqs: list[Seq], device="cpu", sp=None) -> list[torch.Tensor]:
    """A value head's (token classification, one label) estimate at each position that predicts a
    response token, per sequence: the same positions the actor's log-probs come from."""
    n, seqs = len(seqs), _with_tower(critic, seqs)
    p = pack(seqs, device, uses_segments(critic), rope_index(critic), sp.size if sp else 1)
    mine, whole = _slice(p, sp)
    out = _forward(critic, mine)
    return _fold(list(torch.split(whole(out.logits[0, mine.keep, 0].float()), p.lengths)), n)


def pad(
    rows: list[torch.Tensor | list[float]], width: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged rows -> (B, T) values (zero past each row's end) and mask."""
    rows = [r if isinstance(r, torch.Tensor) else torch.tensor(r, dtype=torch.float32) for r in rows]
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    width = width or max(lengths.tolist(), default=0)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    return unpacked(torch.cat(rows) if rows else torch.zeros(0), lengths, width), mask
