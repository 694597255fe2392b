"""The parts of a model cut in two files: a part left out is an ``AbsentPart`` that names the missing file when
called, and two complementary halves join into one model with the settings each describes; anything else is not
joined (the pipeline then reports a second model)."""

import pytest
import torch
from diffusers import AutoencoderKL

from diffsynth.core.loader import ModelLoadError
from diffsynth.core.loader.original_layout import AbsentPart, absent_parts, join_parts, leave_out

SMALL = dict(block_out_channels=(8,), layers_per_block=1, norm_num_groups=4, latent_channels=4)


def half(present: str, seed: int = 0, **config) -> AutoencoderKL:
    torch.manual_seed(seed)
    model = AutoencoderKL(**{**SMALL, **config})
    other = "decoder" if present == "encoder" else "encoder"
    leave_out(model, {other: (f"add the {other} file", ("out_channels",) if other == "decoder" else ())})
    return model


def test_an_absent_part_holds_nothing_and_names_the_file_to_add():
    model = half("encoder")
    assert set(absent_parts(model)) == {"decoder"} and not any("decoder" in key for key in model.state_dict())
    with pytest.raises(ModelLoadError, match="add the decoder file"):
        model.decode(torch.zeros(1, 4, 2, 2))


def test_two_halves_join_with_the_settings_each_describes():
    encoder, decoder = half("encoder", seed=1), half("decoder", seed=2, out_channels=1)
    decoder_weights = {key: value.clone() for key, value in decoder.decoder.state_dict().items()}
    assert join_parts(encoder, decoder)
    assert not absent_parts(encoder) and encoder.config.out_channels == 1
    assert all(torch.equal(value, decoder_weights[key]) for key, value in encoder.decoder.state_dict().items())
    assert encoder.decode(torch.zeros(1, 4, 2, 2)).sample.shape[1] == 1


def test_whole_models_and_halves_of_one_side_are_not_joined():
    whole = AutoencoderKL(**SMALL)
    assert not join_parts(half("encoder"), whole) and not join_parts(whole, half("decoder"))
    assert not join_parts(half("encoder"), half("encoder"))
    assert isinstance(half("encoder").decoder, AbsentPart)


def test_halves_of_different_models_are_refused():
    with pytest.raises(ModelLoadError, match="describe different models.*latent_channels"):
        join_parts(half("encoder"), half("decoder", latent_channels=8))
