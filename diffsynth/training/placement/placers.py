"""Where each model of a task stage computes: the models that move (offload, block swap) get a placer each.

Every placer satisfies one protocol, so the loop holds one list: ``after_backward`` ends a backward pass (weights
unloaded, host gradients handed to ``.grad``) and, on the micro-step that ends an optimizer step, averages the
model's trainable gradients across processes, since no DDP wraps a model whose weights move; ``remove`` undoes the
placement; ``meter`` counts the weights it holds on the device. Without offload or block swap no model moves: they
go to the device and DDP wraps the training module, so there are no placers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch

from ...core.offload_training import OffloadTrainingManager, ResidencyMeter, create_offloader
from ...core.offload_training.grad_sync import GradientSynchronizer, distributed_world_size

if TYPE_CHECKING:
    from ..config.placement import PlacementConfig
    from ..objective.training_module import DiffusionTrainingModule


class Placer(Protocol):
    """A model's placement for one task stage."""

    meter: ResidencyMeter

    def after_backward(self, sync_gradients: bool = True) -> None:
        """Ends a backward pass; with ``sync_gradients`` (the step's last micro-batch) averages the gradients."""

    def remove(self) -> None:
        """Restores the model as it was before the placement."""


class ResidentModel:
    """A model on the device whole beside a block-swapped one: no DDP wraps the training module then, so the
    model's trainable gradients are averaged here."""

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        model.to(device)
        self.meter = ResidencyMeter()  # it moves nothing
        trainable = [param for param in model.parameters() if param.requires_grad]
        self._grad_sync = GradientSynchronizer(trainable) if trainable and distributed_world_size() > 1 else None

    def after_backward(self, sync_gradients: bool = True) -> None:
        if sync_gradients and self._grad_sync is not None:
            self._grad_sync.all_reduce_mean()

    def remove(self) -> None:
        """Nothing to undo: the model stays on the device."""


def place_models(module: DiffusionTrainingModule, device: torch.device, placement: PlacementConfig) -> list[Placer]:
    """Puts the stage's models where they compute: under offload managers, under block swap, or on the device.

    One manager per model rather than one over the pipeline: the pipeline object itself is never called, and each
    manager needs its model's own forward to bracket the saved-tensor hooks. Block swap (``--blocks_to_swap``)
    applies to the denoising models only; the other models go to the device whole.

    Returns:
        The placers the loop calls ``after_backward()`` and ``remove()`` on; empty when no model moves.
    """
    pipe = module.pipe
    pipe.manage_model_devices = False
    models = {name: getattr(pipe, name) for name in module.active_model_names()}
    if placement.enable_model_cpu_offload:
        return [OffloadTrainingManager(model, device, **placement.offload_options(
                    any(param.requires_grad for param in model.parameters()))) for model in models.values()]
    if placement.blocks_to_swap:
        return [create_offloader(model, placement.block_swap, device) if name in pipe.denoising_model_names
                else ResidentModel(model, device) for name, model in models.items()]
    for model in models.values():
        model.to(device)
    return []


def wrap_data_parallel(accelerator: Any, module: DiffusionTrainingModule) -> torch.nn.Module:
    """The training module wrapped by accelerate for several processes (DDP), its frozen parts left out.

    DDP averages trainable gradients only, yet checks the devices of every parameter and broadcasts every buffer each
    step: a skeleton model (``--offload_models``, weights on the meta device) fails that check, and frozen models'
    buffers would be copied for nothing. So only trainable parameters are DDP's.
    """
    if accelerator.num_processes > 1:
        from torch.nn.parallel import DistributedDataParallel

        ignored = [name for name, param in module.named_parameters() if not param.requires_grad]
        ignored += [name for name, _ in module.named_buffers()]
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, ignored)
    return accelerator.prepare_model(module, device_placement=False)
