"""The loss mask on every registered family: it lands on the grid of the family's own latents, and the SFT loss
reads it (white: the unmasked loss exactly; black: 0; half: in between)."""

import pytest
import torch
from PIL import Image

from diffsynth.pipelines.registry import families
from diffsynth.testing.families import tiny_family
from diffsynth.training.objective.loss import DirectDistillLoss, FlowMatchSFTLoss
from diffsynth.training.objective.loss_mask import LOSS_MASK_KEY, LossMask, pixel_mask, with_latent_grid_mask
from tests.pipelines.family_helpers import load_ours

SIZE = (48, 32)


def sample(video: bool) -> dict:
    picture = Image.new("RGB", SIZE, (200, 40, 90))
    return {"video": [picture] * 5, "prompt": "a red clip"} if video else {"image": picture, "prompt": "a red square"}


def mask(kind: str) -> Image.Image:
    image = Image.new("L", SIZE, 0 if kind == "black" else 255)
    if kind == "half":
        image.paste(0, (0, 0, SIZE[0] // 2, SIZE[1]))
    return image


@pytest.mark.parametrize("name", [spec.name for spec in families()])
def test_every_family_masks_its_own_latents(name, tiny_root):
    spec = next(spec for spec in families() if spec.name == name)
    pipe = load_ours(tiny_root, tiny_family(name))
    if not pipe.maskable_latents:
        pytest.skip(f"{type(pipe).__name__} refuses --masked_loss (tests/training/startup/test_masks.py)")
    with torch.no_grad():
        state = pipe.run_units(*pipe.training_inputs(sample(spec.video)))

    def loss(kind: str | None) -> float:
        shared = state[0] if kind is None else {**state[0], LOSS_MASK_KEY: pixel_mask(mask(kind))}
        masked = with_latent_grid_mask((shared, *state[1:]))
        loss = FlowMatchSFTLoss(mask=None if kind is None else LossMask())
        with torch.no_grad():
            return loss(pipe, masked[0], masked[1], masked[2], generator=torch.Generator().manual_seed(0)).item()

    latents = state[0]["input_latents"]
    grid = with_latent_grid_mask(({**state[0], LOSS_MASK_KEY: pixel_mask(mask("half"))}, {}, {}))[0][LOSS_MASK_KEY]
    assert grid.shape == (1, 1, *latents.shape[2:])
    assert grid.min().item() == 0.0 and grid.max().item() == 1.0  # the edge falls between cells
    plain = loss(None)
    assert loss("white") == plain and loss("black") == 0.0
    assert 0.0 < loss("half") < plain


def test_direct_distillation_weighs_its_clean_latent_match_by_the_mask(tiny_root):
    pipe = load_ours(tiny_root, tiny_family("qwen_image"))
    with torch.no_grad():
        state = pipe.run_units(*pipe.training_inputs(sample(False)))

    def loss(kind: str | None) -> float:
        shared = state[0] if kind is None else {**state[0], LOSS_MASK_KEY: pixel_mask(mask(kind))}
        masked = with_latent_grid_mask((shared, *state[1:]))
        distill = DirectDistillLoss(num_inference_steps=2, mask=None if kind is None else LossMask())
        with torch.no_grad():
            return distill(pipe, *masked, generator=torch.Generator().manual_seed(0)).item()

    plain = loss(None)
    assert loss("white") == plain and loss("black") == 0.0 and 0.0 < loss("half") < plain
