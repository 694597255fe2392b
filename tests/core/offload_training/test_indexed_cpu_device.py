"""Offload on ``cpu:0``, the device accelerate gives each of several CPU processes (gloo).

CPU tensors report a bare ``cpu``, and ``torch.device("cpu") != torch.device("cpu", 0)``: a manager that kept the
index recognised none of the weights autograd saved as its device copies, so autograd kept the copies themselves and
every unload found its buffer still referenced (an escape: a fresh allocation at the next load). Before the device
pool tracked its loans by buffer, the same mismatch left every loan unreturned: about 5 MB per step per process on
the tiny Qwen-Image (``scripts/bench_soak.py``).
"""

import copy

import torch
from peft import LoraConfig

from diffsynth.core import OffloadTrainingManager

from .test_diffusers_models import lora_train, tiny_qwen_image


def test_a_manager_on_cpu_0_reuses_every_buffer_after_the_first_steps():
    base, targets, inputs = tiny_qwen_image()
    base.requires_grad_(False)
    base.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=targets, init_lora_weights="gaussian"))
    base.enable_gradient_checkpointing()
    manager = OffloadTrainingManager(base, torch.device("cpu", 0))
    lora_train(base, inputs, steps=2, manager=manager)
    warm = copy.copy(manager.device_pool_stats)
    lora_train(base, inputs, steps=2, manager=manager)
    stats = manager.device_pool_stats
    assert stats.escapes == 0 and stats.reuses > warm.reuses
    assert stats.allocations == warm.allocations and stats.reserved_bytes == warm.reserved_bytes
