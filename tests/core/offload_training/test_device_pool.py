"""Reused device buffers: the pool on its own, then inside the offload manager (no allocation after warm-up, no
buffer reused while something still reads it, results equal to plain training)."""

import copy

import pytest
import torch
from peft import LoraConfig
from torch import nn

from diffsynth.core import OffloadTrainingManager
from diffsynth.core.device import resolve_device
from diffsynth.core.offload_training import DeviceBufferPool
from diffsynth.core.offload_training.device_pool import recurring_sizes

from .models import make_batches, make_model
from .test_diffusers_models import lora_train, tiny_qwen_image, tiny_wan
from .test_manager import MODES, assert_same, state, train

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(params=DEVICES)
def device(request):
    return resolve_device(request.param)


def storage_of(tensor):
    return tensor.untyped_storage().data_ptr()


# ---- the pool -----------------------------------------------------------------------------------------------------


def test_a_buffer_given_back_is_lent_again_for_any_dtype_of_the_same_byte_size(device):
    pool = DeviceBufferPool(device)
    like = torch.empty(4, 8, dtype=torch.float32)
    buffer = pool.take(like)
    first = buffer.view_as(like)
    assert first.shape == (4, 8) and first.dtype == torch.float32 and first.device == device
    address = storage_of(first)
    assert pool.give_back(buffer)
    other = torch.empty(64, dtype=torch.bfloat16)
    again = pool.take(other)
    assert again is buffer
    assert again.view_as(other).shape == (64,) and again.view_as(other).dtype == torch.bfloat16
    assert storage_of(again.view_as(other)) == address
    assert again.view_as(other) is again.view_as(other)  # a view is made once per dtype and shape, then kept
    assert (pool.stats.allocations, pool.stats.reuses, pool.stats.escapes) == (1, 1, 0)
    assert pool.stats.reserved_bytes == pool.stats.in_use_bytes == 128
    assert pool.give_back(again)  # the views it keeps are the pool's own: no escape


def test_buffers_in_use_are_never_lent_twice_and_other_sizes_get_their_own(device):
    pool = DeviceBufferPool(device)
    likes = [torch.empty(16)] * 3 + [torch.empty(32)]
    buffers = [pool.take(like) for like in likes]
    assert len({storage_of(b.view_as(like)) for b, like in zip(buffers, likes)}) == 4
    assert pool.stats.allocations == 4 and pool.stats.reserved_bytes == 3 * 64 + 128
    for buffer in buffers:
        assert pool.give_back(buffer)
    assert pool.free_bytes() == pool.stats.reserved_bytes
    pool.release_free()
    assert pool.stats.reserved_bytes == 0 and pool.free_bytes() == 0


def test_a_buffer_still_referenced_elsewhere_is_not_reused(device):
    pool = DeviceBufferPool(device)
    like = torch.empty(8)
    buffer = pool.take(like)
    buffer.view_as(like).copy_(torch.arange(8.0))
    kept = buffer.view_as(like)[2:]  # someone holds a view past the unit's unload
    assert not pool.give_back(buffer)
    assert pool.stats.escapes == 1 and pool.stats.reserved_bytes == 0
    other = pool.take(like).view_as(like)
    other.fill_(-1.0)
    assert storage_of(other) != storage_of(kept)
    torch.testing.assert_close(kept.cpu(), torch.arange(2.0, 8.0))


def test_only_the_sizes_given_are_pooled_and_only_dense_non_empty_tensors(device):
    assert recurring_sizes([torch.empty(4), torch.empty(2, 2), torch.empty(3), torch.empty(0), torch.empty(0)]) == {16}
    pool = DeviceBufferPool(device, sizes={16})
    assert pool.accepts(torch.empty(4)) and pool.accepts(torch.empty(8, dtype=torch.bfloat16))
    assert not pool.accepts(torch.empty(3)) and not pool.accepts(torch.empty(4, 2)[:, 0])
    assert not DeviceBufferPool(device).accepts(torch.empty(0))


# ---- inside the manager -------------------------------------------------------------------------------------------


def test_a_size_only_one_tensor_has_is_not_kept_by_the_pool():
    model = make_model()
    manager = OffloadTrainingManager(model, "cpu")
    train(model, make_batches(2), manager)
    embedding = manager._offloaders[id(model.embed.weight)]  # 32 x 16, tied to the head: one tensor of its size
    linear = manager._offloaders[id(model.blocks[0].linear.weight)]  # 16 x 16 in every block
    assert not manager.device_pool.accepts(embedding.master) and manager.device_pool.accepts(linear.master)
    assert embedding.load_count >= 2 and embedding.live_copy_bytes() == 0
    assert manager.device_pool.free_bytes() == manager.device_pool_stats.reserved_bytes > 0


@pytest.mark.parametrize("depth", [0, 1, 2])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
@pytest.mark.parametrize("mode", MODES)
def test_after_the_first_steps_every_load_reuses_a_buffer(mode, checkpointing, depth):
    model = make_model(use_gradient_checkpointing=checkpointing)
    manager = OffloadTrainingManager(model, "cpu", prefetch_depth=depth, **mode)
    batches = make_batches(5)
    train(model, batches[:2], manager)
    warm = copy.copy(manager.device_pool_stats)
    train(model, batches[2:], manager)
    stats = manager.device_pool_stats
    assert stats.allocations == warm.allocations and stats.reserved_bytes == warm.reserved_bytes
    assert stats.reuses > warm.reuses and stats.escapes == 0
    assert stats.in_use_bytes == manager.resident_bytes == 0


@pytest.mark.parametrize("mode", MODES)
def test_training_with_and_without_reused_buffers_is_identical(mode):
    batches = make_batches(4)
    reference = make_model(use_gradient_checkpointing=True)
    offloaded = copy.deepcopy(reference)
    fresh = OffloadTrainingManager(reference, "cpu", prefetch_depth=1, reuse_device_buffers=False, **mode)
    assert fresh.device_pool is None and fresh.device_pool_stats is None
    expected = train(reference, batches, fresh)
    fresh.remove()
    pooled = OffloadTrainingManager(offloaded, "cpu", prefetch_depth=1, **mode)
    losses = train(offloaded, batches, pooled)
    assert pooled.device_pool_stats.reuses > 0
    pooled.remove()
    assert torch.equal(expected, losses)
    assert_same(state(reference), state(offloaded))


@pytest.mark.parametrize("build", [tiny_qwen_image, tiny_wan], ids=["qwen-image", "wan"])
@pytest.mark.parametrize("depth", [0, 2])
def test_diffusers_transformers_under_checkpointing_reuse_every_buffer(build, depth):
    base, targets, inputs = build()
    base.requires_grad_(False)
    base.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=targets, init_lora_weights="gaussian"))
    base.enable_gradient_checkpointing()
    offloaded = copy.deepcopy(base)
    expected = torch.cat([lora_train(base, inputs, steps=2) for _ in range(2)])
    manager = OffloadTrainingManager(offloaded, "cpu", prefetch_depth=depth)
    lora_train(offloaded, inputs, steps=2, manager=manager)
    warm = copy.copy(manager.device_pool_stats)
    losses = lora_train(offloaded, inputs, steps=2, manager=manager)
    stats = manager.device_pool_stats
    assert stats.escapes == 0 and stats.allocations == warm.allocations and stats.reuses > warm.reuses
    # The pool holds, per weight size, the most buffers in flight at once: on the order of the peak residency.
    assert stats.reserved_bytes <= 2 * manager.peak_resident_bytes
    torch.testing.assert_close(losses, expected[2:], rtol=0, atol=1e-6)


class StashingLinear(nn.Linear):
    """Keeps a view of its weight's first row after its forward (an escaping device copy)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.stashed = self.weight.detach()[0]
        return super().forward(x)


class Stash(nn.Module):
    """The second layer has the first one's size, so it would be lent the first one's buffer; the output reads the
    first layer's stashed row after both ran."""

    def __init__(self) -> None:
        super().__init__()
        self.first = StashingLinear(8, 8)
        self.second = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x)) + self.first.stashed


def test_a_weight_view_kept_past_its_unload_keeps_its_values_and_its_buffer():
    torch.manual_seed(0)
    reference = Stash().requires_grad_(False)
    reference.second.bias.requires_grad_(True)
    offloaded = copy.deepcopy(reference)
    manager = OffloadTrainingManager(offloaded, "cpu")
    x = torch.randn(3, 8)
    for _ in range(2):
        for model in (reference, offloaded):
            model(x).square().mean().backward()
        manager.after_backward()
        torch.testing.assert_close(offloaded.second.bias.grad, reference.second.bias.grad, rtol=0, atol=0)
        reference.second.bias.grad = offloaded.second.bias.grad = None
    assert manager.device_pool_stats.escapes >= 1
