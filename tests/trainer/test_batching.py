"""How the driver spreads a batch over workers and micro-batches: groups that share a prompt stay
together when the workers pack it once, the work stays balanced, and every rank gets the same
number of non-empty micro-batches (FSDP's collectives pair up). And the batch itself: a shard
selected, sent through pickle packed, comes back as it was."""

import pickle

import torch

from r1cloud.trainer.batch import Batch
from r1cloud.trainer.placement import Sizes, cost, groups, localize, micro_batches, split_ranks


def sizes(prompts: int, n: int, prompt_len: int = 20) -> Sizes:
    uid, plen, rlen = [], [], []
    for p in range(prompts):
        for k in range(n):
            uid.append(str(p))
            plen.append(prompt_len + p)
            rlen.append(5 + 3 * k + p)
    return Sizes(uid, plen, rlen)


def test_groups_stay_whole_across_ranks_and_micro_batches():
    s = sizes(prompts=8, n=4)
    every = list(range(len(s.uid)))
    plan = micro_batches(s, split_ranks(s, every, 2, share=True), per_micro=4, token_budget=None, share=True)
    assert [len(micros) for micros in plan] == [4, 4]  # 16 samples per rank, 4 per micro-batch
    placed = [i for micros in plan for micro in micros for i in micro]
    assert sorted(placed) == every
    for micros in plan:
        for micro in micros:
            for g in groups(s, micro, share=True):
                assert len(g) == 4  # every group whole
    loads = [sum(cost(s, g) for micro in micros for g in groups(s, micro, True)) for micros in plan]
    assert max(loads) / min(loads) < 1.1


def test_groups_are_halved_when_there_are_fewer_than_parts():
    s = sizes(prompts=1, n=8)
    ranks = split_ranks(s, list(range(8)), 2, share=True)
    assert [len(r) for r in ranks] == [4, 4]
    plan = micro_batches(s, ranks, per_micro=1, token_budget=None, share=True)
    assert [len(m) for m in plan] == [4, 4] and all(len(micro) == 1 for m in plan for micro in m)


def test_token_budget_counts_a_shared_prompt_once():
    s = sizes(prompts=2, n=8, prompt_len=100)
    every = list(range(16))
    shared = sum(cost(s, g) for g in groups(s, every, True))
    separate = sum(cost(s, g) for g in groups(s, every, False))
    assert separate - shared == 7 * 100 + 7 * 101  # seven extra prompt copies per group
    budget = shared // 2 + 1
    assert [len(m) for m in micro_batches(s, [every], 1, budget, share=True)] == [2]
    assert [len(m) for m in micro_batches(s, [every], 1, budget, share=False)] == [-(-separate // budget)]


def test_without_sharing_samples_are_placed_alone():
    s = sizes(prompts=2, n=3)
    every = list(range(6))
    assert [len(g) for g in groups(s, every, share=False)] == [1] * 6
    ranks = split_ranks(s, every, 2)
    loads = [sum(s.prompt[i] + s.response[i] for i in rank) for rank in ranks]
    assert abs(loads[0] - loads[1]) <= 12


def test_localize_sends_each_row_once_with_positions():
    rows, micros = localize([[7, 3], [3, 9], [2]])
    assert rows == [7, 3, 9, 2] and micros == [[0, 1], [1, 2], [3]]


def batch() -> Batch:
    g = torch.Generator().manual_seed(0)
    uid = ["a", "a", "b", "c", "c"]
    plen = torch.tensor([4, 4, 6, 3, 3])
    rlen = torch.tensor([2, 5, 0, 3, 1])
    prompts = {"a": torch.arange(1, 5), "b": torch.arange(10, 16), "c": torch.arange(20, 23)}
    prompt_ids = torch.zeros(5, 6, dtype=torch.int32)
    for i, u in enumerate(uid):
        prompt_ids[i, : len(prompts[u])] = prompts[u]
    mask = torch.arange(5)[None, :] < rlen[:, None]
    per_token = lambda: torch.randn(5, 5, generator=g) * mask  # noqa: E731
    return Batch(
        uid=uid,
        index=torch.tensor([0, 0, 1, 2, 2]),
        prompt_ids=prompt_ids,
        prompt_len=plen,
        response_ids=torch.randint(1, 50, (5, 5), generator=g, dtype=torch.int32) * mask,
        response_len=rlen,
        finished=torch.tensor([True, False, True, True, False]),
        old_logp=per_token(),
        advantages=per_token(),
        scores={"overall": torch.tensor([1.0, 0.0, 0.5, 0.25, 1.0], dtype=torch.float64)},
        image_inputs=[{"pixel_values": torch.ones(2, 3)}, {"pixel_values": torch.zeros(1, 3)}],
        image_of=torch.tensor([0, 0, -1, 1, 1]),
    )


def same(a: Batch, b: Batch) -> None:
    for name, x in a.__dict__.items():
        y = getattr(b, name)
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, y), name
        elif name == "image_inputs":
            assert all(torch.equal(p["pixel_values"], q["pixel_values"]) for p, q in zip(x, y, strict=True))
        elif name == "scores":
            assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
        else:
            assert x == y, name


def test_a_batch_travels_packed_and_arrives_the_same():
    b = batch()
    same(pickle.loads(pickle.dumps(b)), b)
    # packed: each group's prompt once, the responses' tokens without padding
    state = b.__getstate__()
    assert state["prompt_ids"].tolist() == [1, 2, 3, 4, 10, 11, 12, 13, 14, 15, 20, 21, 22]
    assert len(state["old_logp"]) == int(b.response_len.sum()) == 11


def test_a_shard_keeps_its_rows_images_and_only_the_fields_asked_for():
    b = batch()
    shard = b.select([3, 0], keep=("advantages",))
    assert shard.uid == ["c", "a"] and shard.old_logp is None
    assert shard.response_ids.shape == (2, 3) and shard.prompt_ids.shape == (2, 4)  # cut to its longest
    assert torch.equal(shard.advantages, b.advantages[[3, 0], :3])
    assert [tuple(p["pixel_values"].shape) for p in shard.image_inputs] == [(2, 3), (1, 3)]
    assert shard.image_of.tolist() == [1, 0]
    seqs = shard.seqs()
    assert seqs[0][:2] == ([20, 21, 22], b.response_ids[3, :3].tolist()) and seqs[0][2]["key"] == "c"
    same(pickle.loads(pickle.dumps(shard)), shard)
    both = Batch.cat([b.select([2]), b.select([0, 1])])
    assert both.uid == ["b", "a", "a"] and both.image_of.tolist() == [-1, 0, 0]
    # a round of text rows only carries no pictures at all (mixed data): joined either way round
    text = b.select([2]).with_(image_of=None, image_inputs=[])
    for parts, of in (([text, b.select([0, 1])], [-1, 0, 0]), ([b.select([0, 1]), text], [0, 0, -1])):
        joined = Batch.cat(parts)
        assert joined.image_of.tolist() == of and len(joined.image_inputs) == 1
    assert torch.equal(both.old_logp, b.old_logp[[2, 0, 1]])
