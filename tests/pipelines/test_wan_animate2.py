"""Wan2.2-Animate-2: the release's single file read into diffusers' WanAnimate2Transformer3DModel, inference equal to a
two-pass reference assembled from diffusers' own transformer calls (its flex-attention block mask, the reference pass
run anew each call) with CFG, with teeth; the dense CPU attention trains the reference pass too.

diffusers' modular pipelines (``WanAnimate2ModularPipeline``) cut the video into segments with their own
preprocessing; the reference assembled here is the reference pipeline's single-clip call, at the transformer level.
"""

import numpy as np
import pytest
import torch
from diffusers.models.transformers import transformer_wan_animate_2
from PIL import Image

from diffsynth.pipelines.wan_video.animate2 import animate2_prediction
from diffsynth.pipelines.wan_video.animate2_attention import DenseAnimate2AttnProcessor
from diffsynth.pipelines.wan_video.pipeline import ModelConfig, WanVideoPipeline
from diffsynth.testing.tiny_wan import WAN_ORIGINAL_MODEL_ID
from diffsynth.testing.tiny_wan_animate2 import (
    ANIMATE2_DIT_FILES,
    ANIMATE2_ENCODERS,
    WAN_ANIMATE2_MODEL_ID,
    tiny_wan_animate2_transformer,
)

HEIGHT, WIDTH, FRAMES = 32, 48, 5


def frames(seed: int, count: int = FRAMES) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8)) for _ in range(count)]


@pytest.fixture(scope="module")
def pipe(tiny_root):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        return WanVideoPipeline.from_pretrained(torch.float32, "cpu", [
            *(ModelConfig(model_id=WAN_ANIMATE2_MODEL_ID, origin_file_pattern=pattern)
              for pattern in (*ANIMATE2_ENCODERS.values(), ANIMATE2_DIT_FILES["base"])),
            ModelConfig(model_id=WAN_ORIGINAL_MODEL_ID, origin_file_pattern="Wan2.1_VAE.pth")])


def render(pipe, video_seed=2):
    return pipe("a dancer", negative_prompt="blurry", cfg_scale=3.0, seed=7, height=HEIGHT, width=WIDTH,
                num_frames=FRAMES, num_inference_steps=2, output_type="pt", progress_bar=False,
                max_sequence_length=16, animate2_reference_image=frames(1, 1)[0],
                animate2_reference_video=frames(video_seed), animate2_prompt_ref="a person")


def flex_reference(transformer):
    """A ``model_fn`` by diffusers' transformer alone: its flex processor and block mask, both passes every call,
    the sizes the reference pipeline passes (``origin_len`` the frame count, ``origin_area`` the pixel size)."""

    def model_fn(latents, timestep, prompt_emb, animate2_y, animate2_condition, animate2_clip, animate2_clip_ref,
                 animate2_prompt_emb, animate2_unconditional=False, **_):
        cache = transformer_wan_animate_2.WanAnimate2KVCache(len(transformer.blocks))
        condition = animate2_condition[0]
        t = torch.as_tensor(timestep).reshape(1).float()
        grid = torch.tensor([[condition.shape[1], condition.shape[2] // 2, condition.shape[3] // 2]])
        transformer([condition[:16]], t, [animate2_prompt_emb[0]], [condition[16:]], cache, "extract",
                    int(grid.prod()), animate2_clip_ref, offset_grid_sizes=grid)
        out = transformer([latents[0]], t, [prompt_emb[0]], [animate2_y[0]], cache, "cached", latents[0, 0].numel() // 4,
                          animate2_clip, reference_grid_sizes=grid, origin_len=FRAMES, origin_area=[WIDTH, HEIGHT],
                          is_uncondtion=animate2_unconditional, return_dict=False)[0]
        return out[0].unsqueeze(0)

    return model_fn


def test_the_release_file_loads_and_inference_equals_diffusers_two_pass_flex_reference(pipe, monkeypatch):
    import copy

    import torch.nn.attention.flex_attention as flex_attention

    assert type(pipe.dit).__name__ == "WanAnimate2Transformer3DModel" and pipe.dit.config.num_heads == 2
    released = tiny_wan_animate2_transformer(0).state_dict()
    assert all(torch.equal(value, released[key]) for key, value in pipe.dit.state_dict().items())
    flex = copy.deepcopy(pipe.dit)  # diffusers' own processors: the pipeline has not run yet
    ours = render(pipe)
    assert ours.shape == (1, FRAMES, 3, HEIGHT, WIDTH)  # the character's latent frame is not shown
    assert all(isinstance(block.self_attn.processor, DenseAnimate2AttnProcessor) for block in pipe.dit.blocks)
    # The block mask and flex attention run eagerly: compiling them takes seconds on a CPU, for the same numbers.
    build_mask = transformer_wan_animate_2.create_block_mask
    monkeypatch.setattr(transformer_wan_animate_2, "create_block_mask",
                        lambda *args, **kwargs: build_mask(*args, **{**kwargs, "_compile": False}))
    monkeypatch.setattr(flex_attention, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", True)
    monkeypatch.setattr(pipe, "model_fn", flex_reference(flex))
    theirs = render(pipe)
    monkeypatch.undo()
    assert (ours - theirs).abs().max() < 1e-5
    other = render(pipe, video_seed=3)  # another driving video
    assert (other - ours).abs().max() > 1e-3  # a hundred times the tolerance


def test_training_backpropagates_through_the_reference_pass(pipe):
    """The generation pass attends to K/V the reference pass computes with the same self-attention layers: a LoRA
    on them gets gradients from both passes, as in the reference's forward_origin."""
    torch.manual_seed(0)
    shapes = dict(latents=(1, 16, 3, 4, 6), prompt_emb=(1, 16, 32), animate2_y=(1, 20, 3, 4, 6),
                  animate2_condition=(1, 36, 2, 4, 6), animate2_clip=(1, 5, 1280), animate2_clip_ref=(1, 5, 1280),
                  animate2_prompt_emb=(1, 16, 32))
    given = {name: torch.randn(shape) for name, shape in shapes.items()}
    weight = pipe.dit.blocks[0].self_attn.to_q.weight

    def gradient(cache=None):
        weight.grad = None
        with torch.enable_grad():
            weight.requires_grad_(True)
            animate2_prediction(pipe.dit, timestep=torch.tensor([500.0]), animate2_kv_cache=cache,
                                **given).square().mean().backward()
            weight.requires_grad_(False)
        return weight.grad.clone()

    both = gradient()
    frozen = transformer_wan_animate_2.WanAnimate2KVCache(len(pipe.dit.blocks))
    with torch.no_grad():  # the reference pass out of the graph: its K/V are constants
        animate2_prediction(pipe.dit, timestep=torch.tensor([500.0]), animate2_kv_cache=frozen, **given)
    generation_only = gradient(frozen)
    assert both.abs().max() > 0 and (both - generation_only).abs().max() > 1e-3 * both.abs().max()
    with pytest.raises(ValueError, match="animate2_reference_image and animate2_reference_video"):
        pipe.model_fn(given["latents"], 500.0, given["prompt_emb"])  # a cache made without the Animate-2 inputs


def test_a_full_fine_tune_is_written_as_the_release_file_the_loader_reads(tmp_path):
    from safetensors.torch import load_file

    from diffsynth.pipelines.wan_video.original import identify
    from diffsynth.training.outputs.full_model import write_full_model

    model = tiny_wan_animate2_transformer(0)
    (path,) = write_full_model(model, tmp_path, "epoch-0", "dit", formats=("original",))
    assert path.is_file() and path.suffix == ".safetensors"  # one file without a config, as released
    written = load_file(str(path))
    assert torch.equal(written["blocks.1.block.self_attn.q.weight"], model.blocks[1].self_attn.to_q.weight)
    found = identify([path])
    assert found.class_name == type(model).__name__ and set(found.entries) == set(model.state_dict())
    assert {key: found.config[key] for key in ("dim", "num_heads", "num_layers", "in_dim")} == \
        {key: model.config[key] for key in ("dim", "num_heads", "num_layers", "in_dim")}
