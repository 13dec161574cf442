import torch
import torch.nn.functional as F

from benchmarks.encodec_balancer import EncodecBalancer, encodec_step
from benchmarks.runs import hps_mlp
from mtl_bench.balancers import RescaledNormBalancer


def test_the_upstream_test():
    """EnCodec's own test of its Balancer (encodec/balancer.py `test()`): 99 without rescaling, 0 with it."""
    x = torch.zeros(1, requires_grad=True)
    one = torch.ones_like(x)
    EncodecBalancer({"1": 1, "2": 1}, rescale_grads=False).backward(
        {"1": F.l1_loss(x, one), "2": 100 * F.l1_loss(x, -one)}, x
    )
    assert torch.allclose(x.grad, torch.tensor(99.0)), x.grad
    x.grad = None
    EncodecBalancer({"1": 1, "2": 1}, rescale_grads=True).backward(
        {"1": F.l1_loss(x, one), "2": 100 * F.l1_loss(x, -one)}, x
    )
    assert torch.allclose(x.grad, torch.tensor(0.0)), x.grad


def test_scales_follow_the_formula_with_the_bias_corrected_ema():
    """Two steps, β = 0.5: avg_k = (0.5·n_k(1) + n_k(2)) / 1.5 and the input gets Σ_k (w_k/Σw)/avg_k · g_k."""
    bal = EncodecBalancer({"a": 1.0, "b": 3.0}, ema_decay=0.5, per_batch_item=False)
    ca, cb = torch.tensor([3.0, 4.0]), torch.tensor([0.0, 2.0])  # norms 5 and 2
    for factor in (1.0, 2.0):
        x = torch.zeros(2, requires_grad=True)
        bal.backward({"a": (factor * ca * x).sum(), "b": (cb * x).sum()}, x)
    avg_a, avg_b = (0.5 * 5 + 10) / 1.5, (0.5 * 2 + 2) / 1.5
    torch.testing.assert_close(x.grad, 0.25 / avg_a * 2 * ca + 0.75 / avg_b * cb)


def test_the_bench_peer_with_trained_heads_gives_rescaled_norms_gradients():
    """`encodec_step(train_heads=True)`: EnCodec's trunk gradients plus each head's, scaled by its loss's factor,
    the same as RescaledNormBalancer's over three steps of the EMA; without `train_heads` the heads get none."""
    names = ["t0", "t1", "t2"]
    torch.manual_seed(0)
    model = hps_mlp(16, 2, len(names), 1, input_dim=5)
    peer, plain, ours = encodec_step(names, train_heads=True), encodec_step(names), RescaledNormBalancer(names)
    for step in range(3):
        x = torch.randn(8, 5, generator=torch.Generator().manual_seed(step))
        targets = {
            n: torch.randn(8, 1, generator=torch.Generator().manual_seed(10 * step + i)) for i, n in enumerate(names)
        }
        model.zero_grad(set_to_none=True)
        peer(model, x, targets)
        theirs = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        out = model(x)
        ours.backward({n: F.mse_loss(out.preds[n], y) for n, y in targets.items()}, out.shared)
        ours.step()
        for got, expected in zip((p.grad for p in model.parameters()), theirs):
            torch.testing.assert_close(got, expected)
        model.zero_grad(set_to_none=True)
        plain(model, x, targets)
        assert all(p.grad is None for p in model.heads.parameters())
