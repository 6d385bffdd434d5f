"""How the driver spreads a batch over workers and micro-batches: groups that share a prompt stay
together when the workers pack it once, the work stays balanced, and every rank gets the same
number of non-empty micro-batches (FSDP's collectives pair up)."""

from r1cloud.trainer.batch import Rollout, cost, groups, micro_batches, split_ranks


def rollouts(prompts: int, n: int, prompt_len: int = 20) -> list[Rollout]:
    out = []
    for p in range(prompts):
        for k in range(n):
            out.append(
                Rollout(
                    prompt=p,
                    uid=str(p),
                    prompt_ids=[p] * (prompt_len + p),
                    response=[1] * (5 + 3 * k + p),
                    logprobs=[],
                    finished=True,
                    ground_truth="",
                )
            )
    return out


def test_groups_stay_whole_across_ranks_and_micro_batches():
    batch = rollouts(prompts=8, n=4)
    plan = micro_batches(split_ranks(batch, 2, share=True), per_micro=4, token_budget=None, share=True)
    assert [len(micros) for micros in plan] == [4, 4]  # 16 samples per rank, 4 per micro-batch
    placed = [r for micros in plan for micro in micros for r in micro]
    assert sorted(id(r) for r in placed) == sorted(id(r) for r in batch)
    for micros in plan:
        for micro in micros:
            for g in groups(micro, share=True):
                assert len(g) == 4  # every group whole
    loads = [sum(cost(g) for micro in micros for g in groups(micro, True)) for micros in plan]
    assert max(loads) / min(loads) < 1.1


def test_groups_are_halved_when_there_are_fewer_than_parts():
    batch = rollouts(prompts=1, n=8)
    ranks = split_ranks(batch, 2, share=True)
    assert [len(r) for r in ranks] == [4, 4]
    plan = micro_batches(ranks, per_micro=1, token_budget=None, share=True)
    assert [len(m) for m in plan] == [4, 4] and all(len(micro) == 1 for m in plan for micro in m)


def test_token_budget_counts_a_shared_prompt_once():
    batch = rollouts(prompts=2, n=8, prompt_len=100)
    shared = sum(cost(g) for g in groups(batch, True))
    separate = sum(cost(g) for g in groups(batch, False))
    assert separate - shared == 7 * 100 + 7 * 101  # seven extra prompt copies per group
    budget = shared // 2 + 1
    assert [len(m) for m in micro_batches([batch], 1, budget, share=True)] == [2]
    assert [len(m) for m in micro_batches([batch], 1, budget, share=False)] == [-(-separate // budget)]


def test_without_sharing_samples_are_placed_alone():
    batch = rollouts(prompts=2, n=3)
    assert [len(g) for g in groups(batch, share=False)] == [1] * 6
    ranks = split_ranks(batch, 2)
    loads = [sum(len(r.prompt_ids) + len(r.response) for r in rank) for rank in ranks]
    assert abs(loads[0] - loads[1]) <= 12
