"""Adam, written out so every rank's update is the same arithmetic on every backend.
"""

from __future__ import annotations

import torch
from torch import nn


class _Adam:
    """Plain Adam (betas 0.9/0.999, eps 1e-8), written out: ``torch.optim`` imports torch._dynamo on first
    use, which costs each of many ranks sharing a few cores seconds of start-up."""

    def __init__(self, params: list[nn.Parameter], lr: float, betas=(0.9, 0.999), eps: float = 1e-8):
        self.params, self.lr, self.betas, self.eps, self.t = params, lr, betas, eps, 0
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        b1, b2 = self.betas
        c1, c2 = 1 - b1**self.t, 1 - b2**self.t
        for p, m, v in zip(self.params, self.m, self.v, strict=True):
            m.mul_(b1).add_(p.grad, alpha=1 - b1)
            v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            p.addcdiv_(m, (v / c2).sqrt_().add_(self.eps), value=-self.lr / c1)
