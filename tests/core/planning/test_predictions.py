"""The planner's predictions, made on the meta device, against what the same step measures on the CPU.

Resident weight bytes (each policy's residency meter) must match exactly; the bytes autograd saves within 10%
(they match exactly here: the meta run computes attention with the fused kernel the CPU picks too).
"""

import pytest
import torch
from diffusers import QwenImageTransformer2DModel, WanTransformer3DModel
from peft import LoraConfig, inject_adapter_in_model

from diffsynth.core import gradient_checkpoint_forward
from diffsynth.core.offload_training import BlockSwapConfig, OffloadTrainingManager, create_offloader
from diffsynth.core.planning.footprint import measure_step
from diffsynth.core.planning.residency import (
    classic_swap_residency,
    h2d_ring_residency,
    leaf_offload_residency,
    stream_sizes,
    swap_sizes,
)

NUM_LAYERS = 3


def build(name, device, shape):
    """A tiny Qwen-Image or Wan transformer on ``device`` with a LoRA, and inputs of ``shape`` (latent side, frames)."""
    side, frames = shape
    torch.manual_seed(0)
    with torch.device(device):
        if name == "qwen-image":
            model = QwenImageTransformer2DModel(patch_size=2, in_channels=64, out_channels=16, num_layers=NUM_LAYERS,
                                                attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                                guidance_embeds=False, axes_dims_rope=(8, 4, 4))
            targets = ["to_q", "to_k", "to_v", "add_q_proj", "to_out.0", "img_mlp.net.2", "txt_mod.1"]
            inputs = {"hidden_states": torch.randn(1, side * side, 64), "encoder_hidden_states": torch.randn(1, 7, 32),
                          "encoder_hidden_states_mask": torch.ones(1, 7), "timestep": torch.tensor([0.5]),
                          "img_shapes": [[(1, side, side)]], "return_dict": False}
        else:
            model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16,
                                          in_channels=16, out_channels=16, text_dim=32, freq_dim=32, ffn_dim=64,
                                          num_layers=NUM_LAYERS, cross_attn_norm=True,
                                          qk_norm="rms_norm_across_heads", rope_max_seq_len=32)
            targets = ["to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2"]
            inputs = {"hidden_states": torch.randn(1, 16, frames, 2 * side, 2 * side),
                          "encoder_hidden_states": torch.randn(1, 7, 32), "timestep": torch.tensor([500]),
                          "return_dict": False}
    model.requires_grad_(False)
    inject_adapter_in_model(LoraConfig(r=4, lora_alpha=4, target_modules=targets), model)
    for name_, param in model.named_parameters():
        if "lora_" in name_:
            param.requires_grad_(True)
    return model, inputs


def blocks_of(model):
    return getattr(model, "transformer_blocks", None) or model.blocks


def checkpoint(block, *args):
    return gradient_checkpoint_forward(block, True, False, *args)


def prepared(name, device, checkpointing, shape=(4, 2)):
    model, inputs = build(name, device, shape)
    if checkpointing:
        model.enable_gradient_checkpointing(gradient_checkpointing_func=checkpoint)
    return model, (lambda: model(**inputs)[0].float().square().mean())


def train(step, manager=None, steps=2):
    for _ in range(steps):
        step().backward()
        if manager is not None:
            manager.after_backward()


MODELS = ["qwen-image", "wan"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
@pytest.mark.parametrize("depth", [0, 1])
@pytest.mark.parametrize("optimizer_offload", [False, True], ids=["frozen", "optimizer-offload"])
def test_leaf_offload_residency_is_predicted_exactly(name, checkpointing, depth, optimizer_offload):
    model, step = prepared(name, "cpu", checkpointing)
    manager = OffloadTrainingManager(model, "cpu", prefetch_depth=depth, enable_optimizer_cpu_offload=optimizer_offload)
    moving = [o for o in manager._offloaders.values() if o.counts_toward_residency]
    train(step, manager)
    before = sum(o.nbytes * o.load_count for o in moving)
    train(step, manager, steps=1)
    moved = sum(o.nbytes * o.load_count for o in moving) - before
    meta, meta_step = prepared(name, "meta", checkpointing)
    predicted = leaf_offload_residency(meta, meta_step, depth, optimizer_offload)
    assert predicted.peak_bytes == manager.peak_resident_bytes > 0
    assert predicted.moved_bytes == moved > 0


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
@pytest.mark.parametrize("swapped", [1, 2, 3])
def test_classic_block_swap_residency_is_predicted_exactly(name, checkpointing, swapped):
    model, step = prepared(name, "cpu", checkpointing)
    offloader = create_offloader(model, BlockSwapConfig(swapped, record_trace=True), "cpu")
    train(step)
    loads = sum(1 for event in offloader.trace if event[0] == "load")
    meta, _ = prepared(name, "meta", checkpointing)
    predicted = classic_swap_residency(swap_sizes(blocks_of(meta)), swapped, checkpointing)
    assert predicted.peak_bytes == offloader.peak_swapped_bytes > 0
    assert predicted.offloaded_bytes == offloader.offloaded_bytes
    assert predicted.moved_bytes * 2 == loads // swapped * offloader.offloaded_bytes  # two steps, blocks of one size


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("swapped, ring", [(1, 1), (2, 1), (3, 2), (3, 1)])
def test_h2d_ring_residency_is_predicted_exactly(name, swapped, ring):
    model, step = prepared(name, "cpu", True)
    offloader = create_offloader(model, BlockSwapConfig(swapped, h2d_only=True, ring_size=ring, record_trace=True),
                                 "cpu")
    train(step, steps=1)
    first_pass = len(offloader.trace)
    train(step, steps=1)
    steady = [event for event in offloader.trace[first_pass:] if event[0] == "load"]
    meta, _ = prepared(name, "meta", True)
    sizes = stream_sizes(blocks_of(meta))
    predicted = h2d_ring_residency(sizes, swapped, ring)
    assert predicted.peak_bytes == offloader.peak_swapped_bytes > 0
    assert predicted.offloaded_bytes == offloader.offloaded_bytes
    assert predicted.moved_bytes == sum(sizes[event[1]][0] for event in steady)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
@pytest.mark.parametrize("shape", [(4, 2), (6, 3)], ids=["small", "large"])
def test_saved_activations_and_flops_predicted_on_meta_match_the_cpu(name, checkpointing, shape):
    model, step = prepared(name, "cpu", checkpointing, shape)
    # The CPU step as it runs: attention by whatever kernel torch picks there.
    measured = measure_step(model, step, blocks_of(model), fused_attention=False)
    meta, meta_step = prepared(name, "meta", checkpointing, shape)
    predicted = measure_step(meta, meta_step, blocks_of(meta))
    assert measured.saved_bytes > 0
    assert abs(predicted.saved_bytes - measured.saved_bytes) <= 0.1 * measured.saved_bytes
    assert predicted.block_saved_bytes == pytest.approx(measured.block_saved_bytes, rel=0.1)
    assert predicted.block_input_bytes == measured.block_input_bytes
    assert predicted.flops == measured.flops > 0


def test_checkpointing_keeps_far_less_than_the_blocks_save():
    meta, step = prepared("qwen-image", "meta", False, (8, 1))
    plain = measure_step(meta, step, blocks_of(meta))
    meta.enable_gradient_checkpointing(gradient_checkpointing_func=checkpoint)
    checked = measure_step(meta, step, blocks_of(meta))
    assert sum(plain.block_saved_bytes) > 0 and checked.block_saved_bytes == [0] * NUM_LAYERS
    assert checked.saved_bytes < plain.saved_bytes - sum(plain.block_saved_bytes) / 2
    assert checked.flops > plain.flops  # the recompute
