"""Offload training on real diffusers transformers with a peft LoRA: equal to plain training."""

import copy

import pytest
import torch
from diffusers import (
    Flux2Transformer2DModel,
    QwenImageTransformer2DModel,
    WanTransformer3DModel,
    ZImageTransformer2DModel,
)
from peft import LoraConfig

from diffsynth.core import OffloadTrainingManager

from .models import optimizer_steps


def tiny_qwen_image():
    torch.manual_seed(0)
    model = QwenImageTransformer2DModel(patch_size=2, in_channels=64, out_channels=16, num_layers=2,
                                        attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                        guidance_embeds=False, axes_dims_rope=(8, 4, 4))
    targets = ["to_q", "to_k", "to_v", "add_q_proj", "to_out.0", "to_add_out", "img_mlp.net.2", "txt_mod.1"]
    inputs = dict(hidden_states=torch.randn(1, 16, 64), encoder_hidden_states=torch.randn(1, 7, 32),
                  encoder_hidden_states_mask=torch.ones(1, 7), timestep=torch.tensor([0.5]),
                  img_shapes=[[(1, 4, 4)]], return_dict=False)
    return model, targets, inputs


def tiny_wan():
    torch.manual_seed(0)
    model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=16,
                                  out_channels=16, text_dim=32, freq_dim=32, ffn_dim=64, num_layers=2,
                                  cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32)
    targets = ["to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2"]
    inputs = dict(hidden_states=torch.randn(1, 16, 2, 8, 8), encoder_hidden_states=torch.randn(1, 7, 32),
                  timestep=torch.tensor([500]), return_dict=False)
    return model, targets, inputs


def tiny_flux2():
    """FLUX.2's double blocks feed their LoRA'd projections views that need a gradient only through the LoRA: a
    checkpoint recompute must route them through the same ops as the forward, or matmul saves other tensors."""
    torch.manual_seed(0)
    model = Flux2Transformer2DModel(in_channels=16, num_layers=1, num_single_layers=2, attention_head_dim=16,
                                    num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=(4, 4, 4, 4),
                                    guidance_embeds=False)
    targets = ["to_q", "to_k", "add_q_proj", "to_out.0", "to_add_out", "linear_in", "to_qkv_mlp_proj"]
    inputs = dict(hidden_states=torch.randn(1, 16, 16), encoder_hidden_states=torch.randn(1, 7, 32),
                  timestep=torch.tensor([0.5]), img_ids=torch.zeros(1, 16, 4), txt_ids=torch.zeros(1, 7, 4),
                  return_dict=False)
    return model, targets, inputs


class _StackedZImage(ZImageTransformer2DModel):
    """Z-Image predicts one tensor per sample; stacked so the parity loss reads it like the others."""

    def forward(self, **inputs):
        return (torch.stack(super().forward(**inputs)[0]),)


def tiny_z_image():
    torch.manual_seed(0)
    model = _StackedZImage(in_channels=16, dim=32, n_layers=2, n_refiner_layers=1, n_heads=2, n_kv_heads=2,
                           cap_feat_dim=24, axes_dims=[4, 6, 6], axes_lens=[64, 32, 32])
    targets = ["to_q", "to_k", "to_v", "to_out.0", "w1", "w2", "w3"]
    inputs = dict(x=[torch.randn(16, 1, 8, 8)], t=torch.tensor([0.5]), cap_feats=[torch.randn(7, 24)],
                  return_dict=False)
    return model, targets, inputs


def lora_train(model, inputs, steps=2, manager=None):
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)

    def loss_of_step(step):
        torch.manual_seed(step)
        output = model(**inputs)[0]
        return (output - torch.randn_like(output)).square().mean()

    return optimizer_steps(optimizer, loss_of_step, steps, manager)


@pytest.mark.parametrize("build", [tiny_qwen_image, tiny_wan, tiny_flux2, tiny_z_image],
                         ids=["qwen-image", "wan", "flux2", "z-image"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
@pytest.mark.parametrize("options", [{}, dict(enable_optimizer_cpu_offload=True),
                                     dict(cpu_offload_split_threshold=0.05)],
                         ids=["frozen-offload", "optimizer-offload", "threshold"])
def test_lora_training_matches_plain_training(build, checkpointing, options):
    base, targets, inputs = build()
    base.requires_grad_(False)
    base.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=targets, init_lora_weights="gaussian"))
    if checkpointing:
        base.enable_gradient_checkpointing()
    offloaded = copy.deepcopy(base)
    expected = lora_train(base, inputs)
    manager = OffloadTrainingManager(offloaded, "cpu", **options)
    losses = lora_train(offloaded, inputs, manager=manager)
    assert manager.peak_resident_bytes < sum(p.numel() * p.element_size() for p in base.parameters())
    manager.remove()
    torch.testing.assert_close(losses, expected, rtol=0, atol=1e-6)
    trained = {n: p for n, p in offloaded.named_parameters() if p.requires_grad}
    for name, param in base.named_parameters():
        if param.requires_grad:
            torch.testing.assert_close(trained[name], param, rtol=0, atol=1e-6)
