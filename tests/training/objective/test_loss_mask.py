"""Loss masks: decoding, the map onto the latent grid (images and video frames), the weights and the reduction."""

import numpy as np
import pytest
import torch
from PIL import Image

from diffsynth.training.objective.loss import _per_sample_mse
from diffsynth.training.objective.loss_mask import (
    LOSS_MASK_KEY,
    LossMask,
    latent_grid_mask,
    pixel_mask,
    with_latent_grid_mask,
)


def block_means(array: np.ndarray, factor: int) -> np.ndarray:
    """The reference area downsampling: the mean of each ``factor`` x ``factor`` block."""
    height, width = array.shape
    return array.reshape(height // factor, factor, width // factor, factor).mean(axis=(1, 3))


def test_a_mask_decodes_to_its_gray_levels_as_fractions():
    gray = Image.fromarray(np.array([[0, 51], [204, 255]], dtype=np.uint8), mode="L")
    assert torch.equal(pixel_mask(gray), torch.tensor([[[0.0, 0.2], [0.8, 1.0]]]))
    # Colour counts by its luma; pure white stays exactly 1.
    colour = Image.new("RGB", (2, 1), (255, 255, 255))
    colour.putpixel((0, 0), (255, 0, 0))
    assert pixel_mask(colour)[0, 0, 0].item() == pytest.approx(76 / 255) and pixel_mask(colour)[0, 0, 1] == 1.0
    frames = pixel_mask([gray, gray.point(lambda value: 255 - value)])
    assert frames.shape == (2, 2, 2)
    torch.testing.assert_close(frames[1], 1 - frames[0])
    assert pixel_mask(None) is None


def test_an_image_mask_is_area_averaged_onto_the_latent_cells():
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(32, 48)).astype(np.uint8)
    mask = pixel_mask(Image.fromarray(pixels, mode="L"))
    latents = torch.zeros(1, 16, 4, 6)
    grid = latent_grid_mask(mask, latents)
    assert grid.shape == (1, 1, 4, 6)
    np.testing.assert_allclose(grid[0, 0].numpy(), block_means(pixels / 255.0, 8), rtol=1e-6)
    # A 5-D image latent (one frame) and a patchified one (16 pixels a cell) follow the latents' own grid.
    assert latent_grid_mask(mask, torch.zeros(1, 16, 1, 4, 6)).shape == (1, 1, 1, 4, 6)
    np.testing.assert_allclose(latent_grid_mask(mask, torch.zeros(1, 128, 2, 3))[0, 0].numpy(),
                               block_means(pixels / 255.0, 16), rtol=1e-6)


def test_white_stays_exactly_one_and_a_sharp_edge_gives_fractions():
    white = torch.ones(1, 32, 32)
    assert torch.equal(latent_grid_mask(white, torch.zeros(1, 16, 4, 4)), torch.ones(1, 1, 4, 4))
    edge = torch.zeros(1, 32, 32)
    edge[:, :, :12] = 1.0  # the edge cuts the second column of cells in half
    assert latent_grid_mask(edge, torch.zeros(1, 16, 4, 4))[0, 0, 0].tolist() == [1.0, 0.5, 0.0, 0.0]


def test_video_frames_map_onto_latent_frames_as_the_causal_vae_groups_them():
    frames = torch.arange(9, dtype=torch.float32)[:, None, None].expand(9, 16, 16) / 8  # frame f holds f / 8
    grid = latent_grid_mask(frames, torch.zeros(1, 16, 3, 2, 2))
    # Latent frame 0 is frame 0 alone; latent frames 1 and 2 average frames 1-4 and 5-8 (Wan: 1 + 4k frames).
    expected = torch.tensor([0.0, np.mean([1, 2, 3, 4]) / 8, np.mean([5, 6, 7, 8]) / 8])
    torch.testing.assert_close(grid[0, 0, :, 0, 0], expected.float())
    assert grid.shape == (1, 1, 3, 2, 2)


def test_one_mask_image_masks_every_frame_of_a_video():
    image = torch.zeros(1, 16, 16)
    image[:, :8] = 1.0
    grid = latent_grid_mask(image, torch.zeros(1, 16, 3, 2, 2))
    assert grid.shape == (1, 1, 3, 2, 2)
    assert all(torch.equal(grid[0, 0, frame], torch.tensor([[1.0, 1.0], [0.0, 0.0]])) for frame in range(3))


def test_frames_that_do_not_map_are_refused():
    with pytest.raises(ValueError, match="8 frames does not map onto 3 latent frames"):
        latent_grid_mask(torch.ones(8, 16, 16), torch.zeros(1, 16, 3, 2, 2))
    with pytest.raises(ValueError, match="for an image"):
        latent_grid_mask(torch.ones(2, 16, 16), torch.zeros(1, 16, 2, 2))


def test_no_mask_is_all_ones_and_a_cached_mask_passes_as_it_is():
    latents = torch.zeros(1, 16, 3, 2, 2)
    assert torch.equal(latent_grid_mask(None, latents), torch.ones(1, 1, 3, 2, 2))
    cached = torch.rand(1, 1, 3, 2, 2)
    assert latent_grid_mask(cached, latents) is cached
    with pytest.raises(ValueError, match="rerun stage 1"):
        latent_grid_mask(torch.rand(1, 1, 2, 2, 2), latents)


def test_the_state_gets_its_mask_on_the_grid_once_the_latents_exist():
    mask = torch.ones(1, 16, 16)
    shared, posi, nega = with_latent_grid_mask(({LOSS_MASK_KEY: mask, "input_latents": torch.zeros(1, 4, 2, 2)},
                                                {"p": 1}, {}))
    assert shared[LOSS_MASK_KEY].shape == (1, 1, 2, 2) and posi == {"p": 1} and nega == {}
    before = ({LOSS_MASK_KEY: mask}, {}, {})
    assert with_latent_grid_mask(before) is before  # the latents come later (stage 2)


@pytest.mark.parametrize("unmasked_weight", [0.0, 0.1, 0.3, 0.7, 1.0])
def test_weights_are_w_plus_the_masked_share_and_exactly_one_on_white(unmasked_weight):
    mask = torch.tensor([0.0, 0.25, 0.5, 1.0]).reshape(1, 1, 2, 2)
    weights = LossMask(unmasked_weight).weights({LOSS_MASK_KEY: mask}, torch.zeros(1, 16, 2, 2))
    torch.testing.assert_close(weights, unmasked_weight + (1 - unmasked_weight) * mask)
    assert weights[0, 0, 1, 1].item() == 1.0
    if unmasked_weight == 1.0:
        assert torch.equal(weights, torch.ones_like(mask))
    if unmasked_weight == 0.0:
        assert weights[0, 0, 0, 0].item() == 0.0


def test_weights_refuse_a_mask_of_another_shape_or_none():
    with pytest.raises(ValueError, match="--masked_loss"):
        LossMask().weights({LOSS_MASK_KEY: torch.ones(1, 1, 3, 3)}, torch.zeros(1, 16, 2, 2))
    with pytest.raises(ValueError, match="stage-1 cache"):
        LossMask().weights({}, torch.zeros(1, 16, 2, 2))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        LossMask(1.5)


def test_the_weighted_mean_is_exact_on_white_and_zero_without_nan_on_black():
    prediction = torch.randn(2, 4, 3, 3, requires_grad=True)
    target = torch.randn(2, 4, 3, 3)
    plain = _per_sample_mse(prediction, target)
    assert torch.equal(_per_sample_mse(prediction, target, torch.ones(2, 1, 3, 3)), plain)
    black = _per_sample_mse(prediction, target, torch.zeros(2, 1, 3, 3))
    black.sum().backward()
    assert torch.equal(black, torch.zeros(2)) and torch.equal(prediction.grad, torch.zeros_like(prediction))
    # Sum over the elements divided by their count, not by the weights' sum: half the cells, about half the loss.
    half = torch.zeros(2, 1, 3, 3)
    half[..., :1] = 1.0
    expected = ((prediction - target).square() * half).flatten(1).sum(1) / prediction[0].numel()
    torch.testing.assert_close(_per_sample_mse(prediction, target, half), expected)
