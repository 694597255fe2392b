"""Pieces the LoRA tests share."""

import copy

import torch


def random_lora_model(model, targets, rank: int, alpha: float, seed: int = 0):
    """A copy of ``model`` with a peft LoRA of ``rank`` and ``alpha`` on ``targets``, its B factors drawn at random
    (std 0.1, seeded) as a trained LoRA's would be."""
    from peft import LoraConfig, inject_adapter_in_model

    adapted = inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets),
                                      copy.deepcopy(model))
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, parameter in adapted.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.1)
    return adapted
