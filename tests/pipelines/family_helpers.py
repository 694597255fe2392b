"""What the family kit and the per-family pipeline tests share: our pipeline and diffusers' own on a family's tiny repo,
rendered the same way and compared."""

from __future__ import annotations

import pytest
import torch

from diffsynth.core.loader import ModelConfig
from diffsynth.pipelines.registry import family
from diffsynth.testing.families import TinyFamily, tiny_family
from diffsynth.training import entry
from diffsynth.training.config.parsers import HELP_HINT

PROMPT = "a red cube on a blue table"
STEPS = 3


def model_configs(entries) -> list[ModelConfig]:
    """``ModelConfig`` of each ``"model_id:pattern"`` entry."""
    return [ModelConfig(model_id=entry.split(":", 1)[0], origin_file_pattern=entry.split(":", 1)[1])
            for entry in entries]


def load_ours(tiny_root, tiny: TinyFamily | str, entries=None):
    """The family's pipeline (a ``TinyFamily`` row or a family name) on the tiny repos (float32, CPU), with the
    models of ``entries`` (``"model_id:pattern"``; by default every model of the family's row)."""
    tiny = tiny_family(tiny) if isinstance(tiny, str) else tiny
    entries = list(tiny.models.values()) if entries is None else entries
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        return family(tiny.name).pipeline_class().from_pretrained(torch.float32, "cpu", model_configs(entries))


def load_theirs(tiny_root, reference_class, model_id: str):
    """Diffusers' ``reference_class`` on the tiny repo ``model_id``, float32, without a progress bar."""
    pipe = reference_class.from_pretrained(str(tiny_root / model_id), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def render_ours(pipe, seed=7, prompt=PROMPT, **kwargs):
    """Our pipeline's image or frames; of an audio+video pipeline's ``(frames, waveform)``, the frames (each family's
    own tests compare the sound)."""
    output = pipe(prompt, seed=seed, num_inference_steps=kwargs.pop("num_inference_steps", STEPS),
                  output_type=kwargs.pop("output_type", "pt"), progress_bar=False, **kwargs)
    return output[0] if isinstance(output, tuple) else output


def render_theirs(pipe, seed=7, prompt=PROMPT, output="images", **kwargs):
    return getattr(pipe(prompt=prompt, generator=torch.Generator().manual_seed(seed),
                        output_type=kwargs.pop("output_type", "pt"),
                        num_inference_steps=kwargs.pop("num_inference_steps", STEPS), **kwargs), output)


def assert_same_output(ours, reference, render_other, shape=None, tolerance=1e-4):
    """Our output equals diffusers' within ``tolerance``, and the check has teeth: ``render_other()`` (another seed)
    moves it far beyond."""
    assert ours.shape == reference.shape, (ours.shape, reference.shape)
    if shape is not None:
        assert tuple(ours.shape) == shape
    assert (ours - reference).abs().max() < tolerance
    assert (render_other() - reference).abs().max() > 1e-2


def refused_before_loading(pipeline_class, argv, workdir, capsys, video=False) -> str:
    """Runs the trainer on ``argv`` (``--output_path out`` added), expects it to stop with exit status 2 before
    loading anything, after one problem line and the parser's hint; returns that line."""
    with pytest.raises(SystemExit) as stopped:
        entry.main(pipeline_class, ["--output_path", "out", *argv], video=video)
    assert stopped.value.code == 2
    *problems, hint = capsys.readouterr().err.split("error:", 1)[1].strip().splitlines()
    assert hint.endswith(HELP_HINT), hint
    assert len(problems) == 1, problems
    assert not (workdir / "out").exists()
    return problems[0]


def public_config(model) -> dict:
    """The model's config without bookkeeping fields (library versions, dtype, the class it was saved from); tuples
    as lists, as a config.json holds them."""
    config = model.config.to_dict() if hasattr(model.config, "to_dict") else dict(model.config)
    bookkeeping = {"dtype", "transformers_version", "architectures", "name_or_path", "torch_dtype"}
    return {key: list(value) if isinstance(value, tuple) else value for key, value in config.items()
            if not key.startswith("_") and key not in bookkeeping}


def assert_same_model(actual, expected):
    """Two models of one class with the same public config and equal weights under the same names."""
    assert type(actual) is type(expected)
    assert public_config(actual) == public_config(expected)
    actual_state, expected_state = actual.state_dict(), expected.state_dict()
    assert actual_state.keys() == expected_state.keys()
    for key, tensor in expected_state.items():
        assert torch.equal(actual_state[key], tensor), key


def noised_input_image(pipe, prompt=PROMPT) -> tuple[torch.Tensor, dict]:
    """Runs ``pipe``'s units on a 32 x 32 input image at denoising strength 0.5 (seed 3; the caller sets the
    scheduler's timesteps) and checks that the start latents are the input's latents noised to the first sigma;
    returns ``(first sigma, shared state)``."""
    from PIL import Image

    image = Image.new("RGB", (32, 32), (200, 30, 90))
    shared, _, _ = pipe.run_units({"height": 32, "width": 32, "seed": 3, "input_image": image,
                                   "denoising_strength": 0.5}, {"prompt": prompt}, {})
    sigma = pipe.scheduler.sigmas[0]
    expected = (1 - sigma) * shared["input_latents"] + sigma * shared["noise"]
    assert torch.allclose(shared["latents"], expected, atol=1e-6)
    return sigma, shared
