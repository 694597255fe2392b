"""The leaf-offload policy under gradient checkpointing: a unit fed only by inputs that need no gradient."""

import copy

import torch
from torch import nn

from diffsynth.core import OffloadTrainingManager, gradient_checkpoint_forward

from .models import optimizer_steps

DIM = 16


class ModulatedBlock(nn.Module):
    """A block whose modulation is computed from an embedding that needs no gradient (Qwen-Image's ``img_mod``)."""

    def __init__(self) -> None:
        super().__init__()
        self.mod = nn.Linear(DIM, DIM)
        self.linear = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.linear(x)) * self.mod(embedding)


class Modulated(nn.Module):
    def __init__(self, num_blocks: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(ModulatedBlock() for _ in range(num_blocks))
        self.requires_grad_(False)
        self.blocks[-1].linear.requires_grad_(True)

    def forward(self, x: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = gradient_checkpoint_forward(block, True, False, x, embedding)
        return x


def train(model, manager=None, steps=3):
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    generator = torch.Generator().manual_seed(1)

    def loss_of_step(_):
        x = torch.randn(3, DIM, generator=generator).requires_grad_(True)
        embedding = torch.randn(3, DIM, generator=generator)
        return model(x, embedding).square().mean()

    return optimizer_steps(optimizer, loss_of_step, steps, manager)


def test_a_recomputed_unit_whose_outputs_need_no_gradient_is_released_after_its_recompute():
    reference = Modulated()
    offloaded = copy.deepcopy(reference)
    manager = OffloadTrainingManager(offloaded, "cpu")
    assert torch.equal(train(reference), train(offloaded, manager))
    block_bytes = sum(p.numel() * p.element_size() for p in reference.blocks[0].parameters())
    # Without the release every block's modulation stayed loaded from its recompute until after_backward().
    assert manager.peak_resident_bytes <= block_bytes
    assert manager.resident_bytes == 0
