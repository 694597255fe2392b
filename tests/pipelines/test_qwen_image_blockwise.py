"""Qwen-Image Blockwise ControlNets: the released file read into our module, and the denoiser with a control image
equal to an independent plain-torch re-statement of the reference's forward (``model_fn_qwen_image`` with its
``QwenImageUnit_BlockwiseControlNet``) on the same tiny weights."""

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw
from safetensors.torch import load_file

from diffsynth.pipelines.qwen_image import ControlNetInput
from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID, QWEN_IMAGE_PATTERNS
from diffsynth.testing.tiny_qwen_blockwise import QWEN_BLOCKWISE_MODEL_ID
from tests.pipelines.family_helpers import load_ours

PROMPT = "a red cube on a blue table"
HEIGHT, WIDTH = 48, 64
QWEN = [f"{QWEN_IMAGE_MODEL_ID}:{QWEN_IMAGE_PATTERNS[name]}" for name in ("dit", "text_encoder", "vae")]


def release(kind):
    return QWEN_BLOCKWISE_MODEL_ID.format(kind=kind)


def picture(color, size=(WIDTH, HEIGHT)):
    image = Image.linear_gradient("L").resize(size).convert("RGB")
    ImageDraw.Draw(image).rectangle((6, 6, 30, 26), fill=color)
    return image


def mask():
    image = Image.new("RGB", (WIDTH, HEIGHT))
    ImageDraw.Draw(image).rectangle((20, 8, 50, 40), fill=(255, 255, 255))
    return image


@pytest.fixture(scope="module")
def pipe(tiny_root):
    return load_ours(tiny_root, "qwen_image", [*QWEN, f"{release('Inpaint')}:model.safetensors"])


# ---- the reference, re-stated in plain torch ---------------------------------------------------------------------

def ref_pixels(image):
    return torch.tensor(np.array(image, dtype=np.float32)).permute(2, 0, 1)[None] * (2 / 255) - 1


def ref_condition(vae, image, inpaint_mask):
    """``QwenImageUnit_BlockwiseControlNet.process`` for one input with a mask."""
    hidden = ref_pixels(inpaint_mask.resize(image.size)).mean(dim=[0, 1])
    array = np.array(image)
    array[hidden.numpy() > 0] = 0
    raw = vae.encode(ref_pixels(Image.fromarray(array))[:, :, None]).latent_dist.mode()[:, :, 0]
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1)
    latents = (raw - mean) / std
    weight = ((ref_pixels(inpaint_mask) + 1) / 2).mean(dim=1, keepdim=True)
    return torch.cat([latents, 1 - torch.nn.functional.interpolate(weight, size=latents.shape[-2:])], dim=1)


def ref_patchify(x):  # B C (H P) (W Q) -> B (H W) (C P Q)
    b, c, h, w = x.shape
    return x.reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, h * w // 4, c * 4)


def ref_rms(x, weight):
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight


def ref_denoiser(dit, weights, latents, timestep, prompt_emb, condition, scale):
    """``model_fn_qwen_image`` with one Blockwise ControlNet input; ``weights``: the released file's tensors."""
    lin = torch.nn.functional.linear
    image = dit.img_in(ref_patchify(latents))
    tokens = image.shape[1]
    temb = dit.time_text_embed(timestep / 1000, image)
    text = dit.txt_in(dit.txt_norm(prompt_emb))
    rope = dit.pos_embed([(1, latents.shape[2] // 2, latents.shape[3] // 2)], max_txt_seq_len=text.shape[1],
                         device=image.device)
    y = lin(ref_patchify(condition), weights["img_in.weight"], weights["img_in.bias"])
    for index, block in enumerate(dit.transformer_blocks):
        text, image = block(hidden_states=image, encoder_hidden_states=text, encoder_hidden_states_mask=None,
                            temb=temb, image_rotary_emb=rope)
        w = {k.split(f"controlnet_blocks.{index}.")[1]: v for k, v in weights.items()
             if k.startswith(f"controlnet_blocks.{index}.")}
        x = ref_rms(image[:, :tokens], w["x_rms.weight"]) + ref_rms(y, w["y_rms.weight"])
        x = lin(torch.nn.functional.gelu(lin(x, w["input_proj.weight"], w["input_proj.bias"])),
                w["output_proj.weight"], w["output_proj.bias"])
        image = image.clone()
        image[:, :tokens] = image[:, :tokens] + x * scale
    out = dit.proj_out(dit.norm_out(image, temb))
    b, _, h, w_ = latents.shape
    return out.reshape(b, h // 2, w_ // 2, -1, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, -1, h, w_)


# ---- the tests -----------------------------------------------------------------------------------------------------

def test_inpaint_denoiser_matches_the_reference_forward(pipe, tiny_root):
    control = ControlNetInput(image=picture((200, 40, 90)), inpaint_mask=mask(), scale=0.7)
    state = pipe.run_units({"height": HEIGHT, "width": WIDTH, "seed": 3, "rand_device": "cpu", "cfg_scale": 1.0,
                            "max_sequence_length": 64, "blockwise_controlnet_inputs": [control]},
                           {"prompt": PROMPT}, {})
    shared, posi = state[0], state[1]
    [(controlnet_id, scale, condition)] = shared["blockwise_controlnet_conditioning"]
    expected_condition = ref_condition(pipe.vae, control.image, control.inpaint_mask)
    assert (controlnet_id, scale) == (0, 0.7) and condition.shape == (1, 17, HEIGHT // 8, WIDTH // 8)
    assert torch.equal(condition[:, 16], expected_condition[:, 16])
    assert (condition - expected_condition).abs().max() < 1e-5

    weights = load_file(str(tiny_root / release("Inpaint") / "model.safetensors"))
    latents, timestep = shared["noise"], torch.tensor([600.0])
    with torch.no_grad():
        ours = pipe.model_fn(latents, timestep, posi["prompt_emb"], posi["prompt_emb_mask"],
                             blockwise_controlnet_conditioning=shared["blockwise_controlnet_conditioning"])
        reference = ref_denoiser(pipe.dit, weights, latents, timestep, posi["prompt_emb"], expected_condition, 0.7)
        plain = pipe.model_fn(latents, timestep, posi["prompt_emb"], posi["prompt_emb_mask"])
        # Several inputs add up, each times its scale (the reference's sum over its inputs).
        split = pipe.model_fn(latents, timestep, posi["prompt_emb"], posi["prompt_emb_mask"],
                              blockwise_controlnet_conditioning=[(0, 0.3, condition), (0, 0.4, condition)])
        other = ref_denoiser(pipe.dit, weights, latents, timestep, posi["prompt_emb"],
                             ref_condition(pipe.vae, picture((20, 220, 40)), mask()), 0.7)
    assert (ours - reference).abs().max() < 1e-5 and (split - reference).abs().max() < 1e-5
    # Teeth: another control image, or none, moves the prediction far beyond the tolerance.
    assert (other - reference).abs().max() > 1e-2 and (plain - reference).abs().max() > 1e-2


def test_without_control_the_output_is_the_plain_pipelines(pipe, tiny_root):
    call = dict(height=32, width=32, seed=5, num_inference_steps=2, cfg_scale=1.0, output_type="pt",
                progress_bar=False)
    plain = load_ours(tiny_root, "qwen_image", QWEN)(PROMPT, **call)
    assert torch.equal(pipe(PROMPT, **call), plain)
    controlled = pipe(PROMPT, blockwise_controlnet_inputs=[ControlNetInput(image=picture((9, 9, 9), (32, 32)),
                                                                           inpaint_mask=mask())], **call)
    assert (controlled - plain).abs().max() > 1e-2
    # The slot holds the release's tensors under its own names, behind the reference's models.<id>. prefix.
    released = load_file(str(tiny_root / release("Inpaint") / "model.safetensors"))
    state = pipe.blockwise_controlnet.state_dict()
    assert set(state) == {f"models.0.{key}" for key in released}
    assert all(torch.equal(state[f"models.0.{key}"], value) for key, value in released.items())
    assert pipe.denoising_model_names == ("dit", "blockwise_controlnet")


def test_bad_control_input_is_named(pipe, tiny_root):
    image = picture((1, 2, 3))
    size = dict(height=32, width=32, num_inference_steps=1)
    with pytest.raises(ValueError, match=r"start=0.9, end=0.0\): a step window is not supported"):
        pipe(PROMPT, blockwise_controlnet_inputs=[ControlNetInput(image=image, start=0.9)], **size)
    with pytest.raises(ValueError, match=r"controlnet_id=1\) names a Blockwise ControlNet that is not loaded"):
        pipe(PROMPT, blockwise_controlnet_inputs=[ControlNetInput(image=image, controlnet_id=1)], **size)
    with pytest.raises(ValueError, match="the Inpaint ControlNet needs inpaint_mask="):
        pipe(PROMPT, blockwise_controlnet_inputs=[ControlNetInput(image=image)], **size)
    plain = load_ours(tiny_root, "qwen_image", QWEN)
    with pytest.raises(ValueError, match="Qwen-Image-Blockwise-ControlNet-Canny:model.safetensors"):
        plain(PROMPT, blockwise_controlnet_inputs=[ControlNetInput(image=image)], **size)


def test_units_do_what_they_declare(pipe):
    from tests.pipelines.declarations import check_declarations

    pipe.scheduler.set_timesteps(2, 0.5, image_seq_len=16)
    shared = {"cfg_scale": 2.0, "height": 32, "width": 32, "seed": 0, "rand_device": "cpu",
              "input_image": Image.new("RGB", (32, 32)), "denoising_strength": 0.5,
              "blockwise_controlnet_image": picture((1, 2, 3), (32, 32)), "blockwise_controlnet_inpaint_mask": mask(),
              "max_sequence_length": 64}
    assert check_declarations(pipe, shared, {"prompt": PROMPT}, {"negative_prompt": "blurry"}) == {}
