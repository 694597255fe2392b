"""Small models that exercise every kind of tensor the offload manager handles."""

from __future__ import annotations

import torch
from torch import nn

from diffsynth.core import gradient_checkpoint_forward

DIM = 16
VOCAB = 32


class Block(nn.Module):
    """Linear, LayerNorm and BatchNorm leaves, plus an orphan parameter used by the block's own forward."""

    def __init__(self, dim: int = DIM) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.linear = nn.Linear(dim, dim)
        self.bn = nn.BatchNorm1d(dim)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.bn(self.linear(self.norm(x)))
        return x + torch.tanh(h) * self.scale


class TiedModel(nn.Module):
    """Embedding tied to the output head, a frozen block, then blocks that train (one with a frozen linear)."""

    def __init__(self, num_blocks: int = 3, use_gradient_checkpointing: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(num_blocks))
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.embed.weight
        self.temperature = nn.Parameter(torch.tensor(0.9))
        self.register_buffer("logit_bias", torch.linspace(-0.1, 0.1, VOCAB))
        self.use_gradient_checkpointing = use_gradient_checkpointing
        self.embed.requires_grad_(False)
        self.blocks[0].requires_grad_(False)
        self.blocks[-1].linear.requires_grad_(False)

    def forward(self, ids: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed(ids)
        if extra is not None:
            x = x + extra
        for block in self.blocks:
            x = gradient_checkpoint_forward(block, self.use_gradient_checkpointing, False, x)
        return self.head(x) / self.temperature + self.logit_bias


def make_model(seed: int = 0, **kwargs) -> TiedModel:
    torch.manual_seed(seed)
    return TiedModel(**kwargs)


def make_batches(steps: int, seed: int = 1, batch: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, VOCAB, (batch,), generator=generator),
             torch.randint(0, VOCAB, (batch,), generator=generator)) for _ in range(steps)]


def optimizer_steps(optimizer: torch.optim.Optimizer, loss_of_step, steps: int, manager=None) -> torch.Tensor:
    """``steps`` optimizer steps on ``loss_of_step(step)``, the offload ``manager`` (if any) told after each backward,
    as the trainer tells it; returns the losses."""
    losses = []
    for step in range(steps):
        loss = loss_of_step(step)
        loss.backward()
        if manager is not None:
            manager.after_backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    return torch.stack(losses)
