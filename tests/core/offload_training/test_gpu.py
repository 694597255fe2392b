"""The same mechanism on a CUDA device: parity with plain training and a real drop in device memory."""

import copy

import pytest
import torch

from diffsynth.core import OffloadTrainingManager

from .models import make_batches, make_model
from .test_manager import MODES, state, train

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_training_on_cuda_matches_plain_cuda_training(mode, checkpointing):
    batches = [(ids.cuda(), targets.cuda()) for ids, targets in make_batches(3)]
    reference = make_model(use_gradient_checkpointing=checkpointing)
    offloaded = copy.deepcopy(reference)
    expected = train(reference.cuda(), batches)
    manager = OffloadTrainingManager(offloaded, "cuda", **mode)
    losses = train(offloaded, batches)
    manager.remove()
    torch.testing.assert_close(losses, expected, rtol=0, atol=1e-6)
    for name, tensor in state(reference).items():
        torch.testing.assert_close(state(offloaded.cuda())[name], tensor, rtol=0, atol=1e-6)


def test_offloaded_weights_leave_the_gpu_between_uses():
    torch.manual_seed(0)
    layers = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)]).requires_grad_(False)
    layers[-1].requires_grad_(True)
    weight_bytes = sum(p.numel() * p.element_size() for p in layers.parameters())
    manager = OffloadTrainingManager(layers, "cuda")
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    x = torch.randn(64, 2048, device="cuda", requires_grad=True)
    loss = layers(x).square().mean()
    assert manager.live_device_copy_bytes() == 0
    loss.backward()
    manager.after_backward()
    peak = torch.cuda.max_memory_allocated() - start
    assert peak < 0.5 * weight_bytes, f"peak {peak} of {weight_bytes} weight bytes"
