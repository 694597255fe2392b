"""Shallow dry runs (``core/planning/shallow.py``) stand for the whole model: the figures extrapolated from three and
four blocks per list equal those of a dry run of every block, for each policy the planner simulates."""

import pytest
import torch
from diffusers import Flux2Transformer2DModel, QwenImageTransformer2DModel, WanTransformer3DModel

from diffsynth.core.planning.plans import Plan, Workload
from diffsynth.core.planning.shallow import shallow_depths
from diffsynth.training.config.parsers import parse_args
from diffsynth.training.placement.planner import build_workload

COMMAND = ["--model_id_with_origin_paths", "unused:transformer/*.safetensors", "--dataset_metadata_path", "unused.csv",
           "--height", "64", "--width", "64", "--task", "sft"]


def lora(targets):
    return ["--lora_base_model", "dit", "--lora_target_modules", targets]


def qwen_image():
    return QwenImageTransformer2DModel(patch_size=2, in_channels=64, out_channels=16, num_layers=5,
                                       attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32, guidance_embeds=False,
                                       axes_dims_rope=(8, 4, 4))


def wan():
    return WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=16,
                                 out_channels=16, text_dim=32, freq_dim=32, ffn_dim=64, num_layers=5,
                                 cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32)


def flux2():
    return Flux2Transformer2DModel(in_channels=16, num_layers=5, num_single_layers=5, attention_head_dim=16,
                                   num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=(4, 4, 4, 4),
                                   guidance_embeds=False)


# Each case dry-runs every block on the meta device: 10 to 20 s of CPU. The fast loop keeps the cheapest (Wan), whose
# assertions are those of the others; ``make test`` runs all four.
@pytest.mark.parametrize("builder, flags", [
    pytest.param(qwen_image, lora("to_q,to_k,to_out.0,img_mlp.net.2"), marks=pytest.mark.slow, id="qwen-image-lora"),
    pytest.param(qwen_image, ["--trainable_models", "dit"], marks=pytest.mark.slow, id="qwen-image-full"),
    pytest.param(wan, lora("to_q,to_k,ffn.net.2") + ["--num_frames", "5"], id="wan-lora"),
    pytest.param(flux2, lora("to_q,to_k,to_out.0"), marks=pytest.mark.slow, id="flux2-lora")])
def test_shallow_runs_predict_what_a_run_of_every_block_does(builder, flags):
    with torch.device("meta"):
        model = builder().to(torch.bfloat16)
    shallow = build_workload(model, parse_args(COMMAND + flags, video="--num_frames" in flags))
    assert shallow_depths(model, shallow.blocks) is not None
    modules = list(model.modules())
    # The same model and step, its blocks given as a plain list: every block runs.
    full = Workload(model, list(shallow.blocks), shallow.step, shallow.set_checkpointing)
    for checkpointing in (False, True):
        assert shallow.footprint(checkpointing) == full.footprint(checkpointing)
    for plan in (Plan("off", "offload", prefetch_depth=0), Plan("on", "offload", prefetch_depth=1,
                                                                 optimizer_offload=True)):
        assert shallow.residency(plan) == full.residency(plan), plan
    assert list(model.modules()) == modules  # every block is back in place


def test_blocks_that_differ_run_in_full():
    with torch.device("meta"):
        model = qwen_image()
    workload = build_workload(model, parse_args(COMMAND + lora("transformer_blocks.1.attn.to_q")))
    assert shallow_depths(model, workload.blocks) is None
    assert shallow_depths(model, list(workload.blocks)) is None  # no list names to cut
