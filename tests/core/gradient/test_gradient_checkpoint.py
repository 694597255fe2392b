import pytest
import torch

from diffsynth.core import gradient_checkpoint_forward


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x, scale=1.0, shift=None):
        self.calls += 1
        y = torch.tanh(self.linear(x)) * scale
        return y + shift if shift is not None else y


@pytest.mark.parametrize("checkpointing,offload", [(False, False), (True, False), (True, True), (False, True)])
def test_gradients_match_a_plain_forward(checkpointing, offload):
    torch.manual_seed(0)
    block = Block()
    x = torch.randn(4, 8, requires_grad=True)
    shift = torch.randn(4, 8, requires_grad=True)
    plain = block(x, scale=2.0, shift=shift).square().sum()
    expected = torch.autograd.grad(plain, [x, shift, block.linear.weight])
    block.calls = 0

    out = gradient_checkpoint_forward(block, checkpointing, offload, x, scale=2.0, shift=shift)
    actual = torch.autograd.grad(out.square().sum(), [x, shift, block.linear.weight])
    for e, a in zip(expected, actual):
        assert torch.equal(e, a)
    # Checkpointing (with or without offload) recomputes the block in backward.
    assert block.calls == (2 if checkpointing or offload else 1)


def test_nothing_is_checkpointed_without_gradients():
    block = Block()
    with torch.no_grad():
        gradient_checkpoint_forward(block, True, True, torch.randn(2, 8))
    assert block.calls == 1


@pytest.mark.gpu
def test_offload_keeps_the_block_input_on_the_host_between_forward_and_backward():
    block = Block().cuda()
    saved_devices = []

    def pack(tensor):
        saved_devices.append(tensor.device.type)
        return tensor

    x = torch.randn(4, 8, device="cuda", requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = gradient_checkpoint_forward(block, True, True, x * 1)
    out.sum().backward()
    assert block.calls == 2 and x.grad is not None
    assert saved_devices and set(saved_devices) == {"cpu"}
