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
from tests.conftest import reset_accelerate_state
from tests.training.conftest import lora

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
    output = pipe(prompt, seed=seed, num_inference_steps=kwargs.pop("num_inference_steps", STEPS), output_type="pt",
                  progress_bar=False, **kwargs)
    return output[0] if isinstance(output, tuple) else output


def render_theirs(pipe, seed=7, prompt=PROMPT, output="images", **kwargs):
    return getattr(pipe(prompt=prompt, generator=torch.Generator().manual_seed(seed), output_type="pt",
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


class Runs:
    """The trainer's runs of one family, each run once: ``runs.lora(name, *flags)`` is its output folder.

    ``lora_base_model`` is the model (or model part, such as Wan VACE's ``vace``) the LoRA runs train, saved without
    its ``pipe.<name>.`` prefix; by default the row's denoiser.
    """

    def __init__(self, spec, tiny, data, folder, tiny_root, lora_base_model=None):
        self.spec, self.tiny, self.data, self.folder, self.tiny_root = spec, tiny, data, folder, tiny_root
        self.lora_base_model = lora_base_model or tiny.denoiser
        self.results = {}

    def lora_flags(self):
        return ["--lora_base_model", self.lora_base_model, "--remove_prefix_in_ckpt", f"pipe.{self.lora_base_model}.",
                "--lora_target_modules", self.tiny.lora_targets, "--lora_rank", "4"]

    def argv(self, output, dataset, models, *extra):
        return ["--dataset_base_path", str(dataset), "--model_id_with_origin_paths", models, "--torch_dtype",
                "float32", "--seed", "3", "--learning_rate", "1e-3", "--height", "32", "--width", "32",
                "--use_gradient_checkpointing", "--num_epochs", "1", *self.tiny.train_flags, "--output_path",
                str(output), *extra]

    def run(self, name, argv):
        if name not in self.results:
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(self.tiny_root))
                try:
                    self.results[name] = entry.main(self.spec.pipeline_class(), argv, video=self.spec.video)
                finally:
                    reset_accelerate_state()
        return self.results[name]

    def lora(self, name, *extra):
        """A one-stage LoRA run with ``extra`` flags; returns its output folder."""
        output = self.folder / name
        self.run(name, self.argv(output, self.data, self.tiny.model_flag, *self.lora_flags(), "--dataset_metadata_path",
                                 str(self.data / "metadata.csv"), *extra))
        return output

    def full(self):
        output = self.folder / "full"
        denoiser = self.tiny.denoiser
        result = self.run("full", self.argv(output, self.data, self.tiny.model_flag, "--trainable_models", denoiser,
                                            "--remove_prefix_in_ckpt", f"pipe.{denoiser}.", "--dataset_metadata_path",
                                            str(self.data / "metadata.csv")))
        return output, result

    def split(self, stage_one_models=None):
        """The split run: stage one caches the encoders' outputs, stage two trains from the cache alone.

        ``stage_one_models`` (``--model_id_with_origin_paths``) defaults to every model but the denoiser; a model whose
        inputs depend on the denoiser's config (Wan Fun) loads it in stage one too, frozen.
        """
        cache, output = self.folder / "cache", self.folder / "split"
        models = stage_one_models or self.tiny.encoders_flag()
        stage_one = self.run("stage_one", self.argv(cache, self.data, models, *self.lora_flags(),
                                                    "--dataset_metadata_path", str(self.data / "metadata.csv"),
                                                    "--task", "sft:data_process"))
        self.run("stage_two", self.argv(output, cache, self.tiny.models[self.tiny.denoiser], *self.lora_flags(),
                                        "--task", "sft:train"))
        return stage_one, output


def lora_file(output):
    """The tensors of a run's ``epoch-0`` LoRA file."""
    return lora(output, "epoch-0")


# The placements that must give the plain run's LoRA, as flags of a family's TinyFamily row.
PLACEMENTS = {"offload": lambda tiny: ["--enable_model_cpu_offload"],
              "block_swap": lambda tiny: ["--blocks_to_swap", str(tiny.blocks_to_swap)],
              "h2d_streaming": lambda tiny: ["--blocks_to_swap", str(tiny.blocks_to_swap + 1), "--block_swap_h2d_only"]}
