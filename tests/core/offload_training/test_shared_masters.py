"""Frozen weights in a shared segment (one host copy per machine) are the host masters of offload and block swap:
used in place, never copied into an arena nor written back, still there after ``remove()``; training is unchanged."""

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from diffsynth.core import OffloadTrainingManager
from diffsynth.core.loader.shared_loading import plan_segment
from diffsynth.core.offload_training import BlockSwapConfig, create_offloader
from diffsynth.core.offload_training.memory_buffer import plan_arena, tensor_nbytes
from diffsynth.core.shared_weights import SharedSegment, is_shared_host, memory_files_supported

from .test_block_swap import lora_model, lora_state, reference, train

pytestmark = pytest.mark.skipif(not memory_files_supported(), reason="needs Linux memory files")


def into_segment(model, names):
    """Moves the named parameters into a fresh segment, laid out as the shared loader lays them out."""
    slots, nbytes = plan_segment(model, names)
    segment = SharedSegment.create(nbytes, "test")
    params = dict(model.named_parameters())
    for name, slot in slots.items():
        view = segment.tensor(slot.offset, slot.dtype, slot.shape)
        view.copy_(params[name].data)
        params[name].data = view
    segment.close_handle()
    return segment


def frozen_names(model, prefix=""):
    return [name for name, param in model.named_parameters() if not param.requires_grad and name.startswith(prefix)]


class SegmentWrites(TorchDispatchMode):
    """Records every operation that writes into the segment (whatever tensor object it writes through)."""

    def __init__(self, segment):
        super().__init__()
        self.base = segment.flat.data_ptr()
        self.writes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for index, argument in enumerate(func._schema.arguments):
            value = args[index] if index < len(args) else kwargs.get(argument.name)
            if (argument.alias_info is not None and argument.alias_info.is_write and isinstance(value, torch.Tensor)
                    and value.device.type == "cpu" and value.untyped_storage().data_ptr() == self.base):
                self.writes.append(str(func))
        return func(*args, **(kwargs or {}))


def test_the_detector_sees_a_write_into_the_segment():
    model, _ = lora_model("wan")
    segment = into_segment(model, frozen_names(model))
    with SegmentWrites(segment) as writes:
        next(p for p in model.parameters() if not p.requires_grad).data.add_(0)
    assert writes.writes == ["aten.add_.Tensor"]


@pytest.mark.parametrize("name", ["qwen-image", "wan"])
def test_offload_streams_shared_weights_in_place(name):
    model, inputs = lora_model(name)
    segment = into_segment(model, frozen_names(model))
    frozen = sum(tensor_nbytes(p) for p in model.parameters() if not p.requires_grad)
    manager = OffloadTrainingManager(model, "cpu")
    # The shared weights are their own masters, and the arena is planned for the buffers only.
    assert sum(tensor_nbytes(o.master) for o in manager._offloaders.values()
               if hasattr(o, "master") and is_shared_host(o.master)) == frozen
    assert manager.pool.reserved_bytes == sum(plan_arena([tensor_nbytes(b) for b in model.buffers()]).capacities)
    with SegmentWrites(segment) as writes:
        losses = lora_train_steps(model, inputs, manager)
        manager.remove()
    expected_losses, expected_state = reference(name, True, "cpu")
    torch.testing.assert_close(losses, expected_losses, rtol=0, atol=1e-6)
    for key, value in expected_state.items():
        torch.testing.assert_close(lora_state(model)[key], value, rtol=0, atol=1e-6)
    assert writes.writes == []
    assert all(is_shared_host(param) for param in model.parameters() if not param.requires_grad)


def lora_train_steps(model, inputs, manager):
    from .test_diffusers_models import lora_train

    return lora_train(model, inputs, 3, manager)


@pytest.mark.parametrize("config", [BlockSwapConfig(blocks_to_swap=2),
                                    BlockSwapConfig(blocks_to_swap=2, h2d_only=True, ring_size=1)],
                         ids=["classic", "h2d"])
def test_block_swap_streams_shared_blocks_in_place(config):
    model, inputs = lora_model("wan")
    swapped = config.host_block_indices(len(model.blocks))
    names = [n for index in swapped for n in frozen_names(model, f"blocks.{index}.")]
    segment = into_segment(model, names)
    with SegmentWrites(segment) as writes:
        offloader = create_offloader(model, dataclasses.replace(config, gradient_checkpointing=True), "cpu")
        if config.h2d_only:  # each streamed block's master is its span of the segment, not a packed private copy
            assert all(is_shared_host(block.master) for block in offloader.streamed.values())
        losses = train(model, inputs, "cpu")
        offloader.remove()
    expected_losses, expected_state = reference("wan", True, "cpu")
    torch.testing.assert_close(losses, expected_losses, rtol=0, atol=1e-6)
    for key, value in expected_state.items():
        torch.testing.assert_close(lora_state(model)[key], value, rtol=0, atol=1e-6)
    assert writes.writes == []  # classic block swap copies other masters back out; never these
    params = dict(model.named_parameters())
    assert all(is_shared_host(params[n]) for n in names)
    assert not any(is_shared_host(p) for n, p in params.items() if n not in names)
