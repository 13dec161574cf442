import torch
import torch.nn.functional as F

from mtl_bench.bench.encodec_balancer import EncodecBalancer


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
