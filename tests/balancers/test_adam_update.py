"""The out-of-place Adam step that GradNorm, FAMO, IMTL-L and UW use for their learned state."""

from __future__ import annotations

import torch

from mtl_bench.balancers.adam_update import adam_update


def test_adam_update_matches_torch_adam():
    g = torch.Generator().manual_seed(0)
    param = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.Adam([param], lr=0.025, betas=(0.8, 0.99), eps=1e-6)
    ours, m, v, step = torch.ones(4), torch.zeros(4), torch.zeros(4), torch.zeros(())
    for _ in range(6):
        grad = torch.randn(4, generator=g)
        param.grad = grad.clone()
        opt.step()
        ours, m, v, step = adam_update(ours, grad, m, v, step, 0.025, (0.8, 0.99), 1e-6)
        torch.testing.assert_close(ours, param.detach(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(v, opt.state[param]["exp_avg_sq"])


def test_the_first_step_moves_each_entry_by_lr_against_its_gradient_sign():
    # Step 1: m_hat = g and v_hat = g^2, so the update is lr * g / (|g| + eps).
    grad = torch.tensor([2.0, -0.5, 0.0])
    zeros = torch.zeros(3)
    new, m, v, step = adam_update(torch.ones(3), grad, zeros, zeros, torch.zeros(()), 0.1, (0.9, 0.999), 1e-8)
    torch.testing.assert_close(new, 1 - 0.1 * grad / (grad.abs() + 1e-8))
    torch.testing.assert_close(m, 0.1 * grad)
    torch.testing.assert_close(v, 0.001 * grad * grad)
    assert step == 1
