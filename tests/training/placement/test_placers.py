"""The one placer list the loop holds: offload managers, block swap and the models beside it, or none at all."""

import pytest
import torch

from diffsynth.core.offload_training import BlockSwap, OffloadTrainingManager
from diffsynth.training.config.placement import PlacementConfig
from diffsynth.training.objective.training_module import DiffusionTrainingModule
from diffsynth.training.placement.placers import Placer, ResidentModel, place_models
from tests.training.objective.test_training_module import TARGETS, load

DEVICE = torch.device("cpu")


@pytest.fixture
def module(base):
    pipe = load("dit", "text_encoder", "vae")
    return DiffusionTrainingModule(pipe, lora_base_model="dit", lora_target_modules=TARGETS, lora_rank=4,
                                   use_gradient_checkpointing=True)


def satisfies_the_protocol(placer: Placer) -> bool:
    return callable(placer.after_backward) and callable(placer.remove) and placer.meter is not None


def test_without_offload_or_block_swap_no_model_moves_and_no_placer_is_made(module):
    assert place_models(module, DEVICE, PlacementConfig()) == []
    assert module.pipe.manage_model_devices is False


def test_offload_places_every_active_model_under_its_own_manager(module):
    placers = place_models(module, DEVICE, PlacementConfig(enable_model_cpu_offload=True))
    assert [type(placer) for placer in placers] == [OffloadTrainingManager] * len(module.active_model_names())
    assert all(satisfies_the_protocol(placer) for placer in placers)
    for placer in placers:
        placer.after_backward(sync_gradients=False)  # no backward yet: a documented no-op
        placer.remove()


def test_block_swap_swaps_the_denoiser_and_keeps_the_others_resident(module):
    placement = PlacementConfig(blocks_to_swap=1, use_gradient_checkpointing=True)
    placers = dict(zip(module.active_model_names(), place_models(module, DEVICE, placement)))
    assert isinstance(placers.pop("dit"), BlockSwap)
    assert placers and all(isinstance(placer, ResidentModel) for placer in placers.values())
    assert all(satisfies_the_protocol(placer) for placer in placers.values())


def test_one_process_averages_nothing_and_a_step_changes_no_gradient(module):
    placement = PlacementConfig(blocks_to_swap=1, use_gradient_checkpointing=True)
    placers = place_models(module, DEVICE, placement)
    params = [param for param in module.parameters() if param.requires_grad]
    for param in params:
        param.grad = torch.full_like(param, 0.5)
    for placer in placers:
        placer.after_backward(sync_gradients=True)
    assert all(torch.equal(param.grad, torch.full_like(param, 0.5)) for param in params)
    for placer in placers:
        placer.remove()
