"""The trainer's own kernels against the plain torch they replace: the LM head's log-probs and
entropies (head.py) and the oneDNN fp32 linear layers (rollout/onednn.py), values and gradients; the
RMSNorm kernels the vLLM engine takes on CPU (rollout/vllm.py) against vLLM's own `native`."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from r1cloud.rollout import onednn
from r1cloud.trainer import model as model_mod
from r1cloud.trainer.head import head_log_probs
from r1cloud.trainer.model import entropy_from_logits, packed_log_probs, plain_head, token_log_probs
from tiny import make_tiny_model

SEQS = [
    ([5, 6, 7, 8, 9], [10, 11, 12]),
    ([5, 6, 7, 8, 9], [13, 14]),
    ([13, 14], [15, 16, 17, 18, 19, 20]),
]


def _case(dtype, entropy_grad, temperature, rows=45, vocab=5000, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, 16, generator=g, dtype=torch.float64)
    weight = torch.randn(vocab, 16, generator=g, dtype=torch.float64) * 0.5
    targets = torch.randint(0, vocab, (rows,), generator=g)
    a, b = torch.randn(rows, generator=g), torch.randn(rows, generator=g)

    def plain(h, w):
        z = h @ w.T
        lp, ent = token_log_probs(z, targets, temperature), entropy_from_logits(z, temperature)
        return lp, ent

    def fused(h, w):
        return head_log_probs(h, w, targets, temperature, entropy_grad)

    def run(fn, h, w):
        h, w = h.detach().requires_grad_(), w.detach().requires_grad_()
        lp, ent = fn(h, w)
        loss = (lp * a.to(lp.dtype)).sum() + ((ent * b.to(ent.dtype)).sum() if entropy_grad else 0)
        return (lp.detach().double(), ent.detach().double(), *torch.autograd.grad(loss, (h, w)))

    truth = run(plain, hidden, weight)  # float64 all through
    low = hidden.to(dtype), weight.to(dtype)
    return truth, run(fused, *low), run(plain, *low)


def _rel(x, y):
    return ((x.double() - y).abs().max() / y.abs().max()).item()


@pytest.mark.parametrize("entropy_grad", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_head_log_probs_fp32_as_close_to_float64_as_the_plain_way(entropy_grad, temperature):
    truth, fused, plain = _case(torch.float32, entropy_grad, temperature)
    for i, name in enumerate(["log-probs", "entropy"]):
        err, plain_err = ((x[i] - truth[i]).abs().max().item() for x in (fused, plain))
        assert err <= max(2 * plain_err, 1e-5), name
    for i, name in [(2, "hidden"), (3, "weight")]:
        assert _rel(fused[i], truth[i]) <= max(3 * _rel(plain[i], truth[i]), 1e-5), f"grad of {name}"


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_head_log_probs_bf16_match_the_plain_way(entropy_grad):
    """In bf16 the logits and their gradient are rounded where lm_head + autograd round them."""
    _, fused, plain = _case(torch.bfloat16, entropy_grad, 0.7)
    assert (fused[0] - plain[0]).abs().max().item() <= 1e-5
    assert (fused[1] - plain[1]).abs().max().item() <= 1e-4
    for i in (2, 3):
        tol = 1e-2 if entropy_grad else 1e-4  # the entropy gradient's terms are summed differently
        assert _rel(fused[i], plain[i].double()) <= tol


def test_head_log_probs_in_chunks_equal_one_chunk_and_backward_runs_once(monkeypatch):
    """Each chunk's gradient is written over its logits once read: seven chunks of 16 rows give
    what one chunk gives. That memory then holds the gradient: autograd refuses a second backward."""
    from r1cloud.trainer import head

    results = []
    for chunk_bytes in (1, 1 << 30):  # the smallest chunk (16 rows), then all 100 rows at once
        monkeypatch.setattr(head, "CHUNK_BYTES", {"cpu": chunk_bytes})
        results.append(_case(torch.float32, True, 0.7, rows=100)[1])
    for many, one in zip(*results, strict=True):
        assert torch.allclose(many, one, rtol=1e-6, atol=1e-7)
    # on a GPU a chunk of Qwen's 152k vocabulary has rows for each of an H200's 132 multiprocessors
    # several times over (the softmax kernels run a row per block); on CPU it stays cache-sized
    monkeypatch.undo()
    assert (
        head._rows(151936, torch.device("cuda")) >= 4 * 132 and head._rows(151936, torch.device("cpu")) == 16
    )
    h = torch.randn(4, 8, requires_grad=True)
    lp, _ = head_log_probs(h, torch.randn(50, 8), torch.tensor([1, 2, 3, 4]))
    lp.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        lp.sum().backward()


def test_head_entropy_without_grad_is_not_differentiable():
    h = torch.randn(4, 8, requires_grad=True)
    lp, ent = head_log_probs(h, torch.randn(50, 8), torch.tensor([1, 2, 3, 4]))
    assert lp.requires_grad and not ent.requires_grad


def test_onednn_linear_equals_torch_forward_and_backward():
    if not onednn.available():
        pytest.skip("torch has no oneDNN linear op here")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 37, 24, generator=g)
    layer = torch.nn.Linear(24, 40)
    ref = torch.nn.Linear(24, 40)
    ref.load_state_dict(layer.state_dict())
    assert onednn.use_in(torch.nn.Sequential(layer))
    grad = torch.randn(2, 37, 40, generator=g)
    xs = [x.clone().requires_grad_() for _ in range(2)]
    outs = [m(xi) for m, xi in zip((layer, ref), xs, strict=True)]
    for out in outs:
        out.backward(grad)
    assert torch.allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    assert torch.allclose(xs[0].grad, xs[1].grad, rtol=1e-5, atol=1e-5)
    for name in ("weight", "bias"):
        assert torch.allclose(getattr(layer, name).grad, getattr(ref, name).grad, rtol=1e-5, atol=1e-4)
    assert onednn.mm_nt(x[0].bfloat16(), layer.weight.bfloat16()).dtype == torch.bfloat16  # torch's path


def _log_probs_and_grads(model):
    model.zero_grad()
    logps, ents = packed_log_probs(model, SEQS, 0.7, entropy=True, entropy_grad=True)
    loss = sum(lp.sum() * (i + 1) for i, lp in enumerate(logps)) + sum(e.sum() for e in ents)
    loss.backward()
    return torch.cat(logps).detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("tie", [False, True])
def test_packed_log_probs_through_head_and_onednn_equal_the_plain_model(
    tiny_model, tmp_path, monkeypatch, tie
):
    """The workers' fp32 actor (head.py and oneDNN linears) against transformers' own lm_head
    and torch's matmul: log-probs and every parameter's gradient, with the output weight tied to
    the embedding (its gradient then sums both uses) and not."""
    if tie:
        tiny_model = make_tiny_model(tmp_path / "tied", tie=True)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    assert plain_head(model) is not None
    onednn.use_in(model)
    lp, grads = _log_probs_and_grads(model)
    plain = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    monkeypatch.setattr(model_mod, "PLAIN_HEADS", set())
    assert plain_head(plain) is None
    lp_plain, grads_plain = _log_probs_and_grads(plain)
    assert (lp - lp_plain).abs().max().item() <= 1e-5
    scale = max(g.abs().max().item() for g in grads_plain.values())
    worst = max((grads[n] - grads_plain[n]).abs().max().item() for n in grads_plain)
    assert scale > 1e-3 and worst <= 1e-5 * scale


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vllm_cpu_norm_kernels_compute_what_vllms_native_ones_do(dtype):
    """The engine's RMSNorm on CPU: vLLM's CPU-build kernels through its IR-op registry, picked
    first for contiguous rows (the priority r1cloud hands vLLM), native for the rest. Values
    against native: the residual sum exact; the norm (of that sum as rounded, for the fused op)
    fp32 to rounding, bf16 within one rounding of the output (the weight is applied before
    rounding, not after)."""
    pytest.importorskip("vllm")
    from vllm import ir

    from r1cloud.rollout.vllm import _cpu_norm_kernels

    priority = _cpu_norm_kernels()["ir_op_priority"]
    g = torch.Generator().manual_seed(0)
    x, res = (torch.randn(300, 576, generator=g).to(dtype) for _ in range(2))
    w = (1 + 0.1 * torch.randn(576, generator=g)).to(dtype)
    with ir.ops.rms_norm.set_priority(priority["rms_norm"]):
        assert ir.ops.rms_norm.dispatch(x, w, 1e-5, None).provider == "r1cloud_cpu"
        assert ir.ops.rms_norm.dispatch(x.t(), w[:300], 1e-5, None).provider == "native"
        ours = ir.ops.rms_norm(x, w, 1e-5)
    native = ir.ops.rms_norm.impls["native"].impl_fn(x, w, 1e-5)
    with ir.ops.fused_add_rms_norm.set_priority(priority["fused_add_rms_norm"]):
        ours_add = ir.ops.fused_add_rms_norm(x.clone(), res.clone(), w, 1e-5)
    native_add = ir.ops.fused_add_rms_norm.impls["native"].impl_fn(x, res, w, 1e-5)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=0, rtol=2**-7)
    torch.testing.assert_close(ours, native, **tol)
    assert torch.equal(ours_add[1], native_add[1])  # the residual: x + res in the dtype
    # the norm of that rounded sum, as the trainer's model computes it (transformers adds the
    # residual in the compute dtype, then normalizes); vLLM's native normalizes the fp32 sum
    torch.testing.assert_close(
        ours_add[0], ir.ops.rms_norm.impls["native"].impl_fn(native_add[1], w, 1e-5), **tol
    )
