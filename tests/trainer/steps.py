"""The workers' `update` and `log_probs` over samples written as tiny.batch_of takes them,
sent as the driver sends them: each rank's shard as a Batch, its micro-batches as rows."""

from __future__ import annotations

from r1cloud.trainer.batch import unpacked
from r1cloud.trainer.group import gather
from tiny import batch_of, shard


def update(trainer, per_rank: list[list[dict]], **kwargs) -> list:
    """The workers' `update` over each rank's mini-batches (shard's format above)."""
    calls = [w.update.remote(*shard(p), **kwargs) for w, p in zip(trainer.workers, per_rank, strict=True)]
    return gather(calls)


def log_probs(trainer, per_rank: list[list[list]], **kwargs) -> list[list[list[list[float]]]]:
    """The workers' `log_probs` over each rank's micro-batches of seqs, as [rank][micro][seq]."""
    calls, shapes = [], []
    for w, micros in zip(trainer.workers, per_rank, strict=True):
        b, _ = batch_of([q for micro in micros for q in micro])
        rows, at = [], 0
        for micro in micros:
            rows.append(list(range(at, at + len(micro))))
            at += len(micro)
        calls.append(w.log_probs.remote(b, rows, **kwargs))
        shapes.append((b, rows))
    out = []
    for (b, rows), flat in zip(shapes, gather(calls), strict=True):
        full = unpacked(flat, b.response_len, b.response_ids.shape[1])
        out.append([[full[i, : int(b.response_len[i])].tolist() for i in micro] for micro in rows])
    return out


def largest_gap(xs: list[list[float]], ys: list[list[float]]) -> float:
    return max(max(abs(a - b) for a, b in zip(x, y, strict=True)) for x, y in zip(xs, ys, strict=True))


def engine_gap(trainer, samples: list[dict], prompts: list, temperature: float) -> tuple[float, list, list]:
    """An engine's samples (tiny.generated's) against two workers' log-probs over the same
    sequences: the largest difference, the sequences, and the workers' log-probs."""
    seqs = [(prompts[s["prompt"]].ids, s["response"]) for s in samples]
    recomputed = log_probs(trainer, [[seqs], [seqs]], temperature=temperature)[0][0]
    return largest_gap([s["logprobs"] for s in samples], recomputed), seqs, recomputed


def large_update(trainer, seqs: list) -> None:
    """One update of two workers that moves the policy far on `seqs` (half pushed up, half down)."""
    samples = [
        {"seq": s, "old": None, "ref": [-5.0] * len(s[1]), "adv": (1.0 if i % 2 else -1.0)}
        for i, s in enumerate(seqs)
    ]
    update(trainer, [[{"total": 8.0, "micro": [samples]}], [{"total": 8.0, "micro": [samples]}]])
