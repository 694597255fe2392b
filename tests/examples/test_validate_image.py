"""The image families' ``validate_lora`` / ``validate_full`` scripts (``diffsynth.training.validate``): every script
names its release, the files its training script reads and writes, and one script of each family (of each kind of
input) renders on the tiny repos: a LoRA at strength 1 or a full fine-tune's weights give a far different image from
the base model's (rendered first from the same load, ``--before_after``), which strength 0 gives.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from diffsynth.lora.before_after import panel_boxes
from diffsynth.training.validate import IMAGE_SUFFIXES, release_script

from .helpers import REPO

EXAMPLES = REPO / "examples"
FAMILIES = ("qwen_image", "z_image", "flux", "flux2", "stable_diffusion", "stable_diffusion_xl", "krea2",
            "ernie_image", "ideogram4", "joyai_image")
SCRIPTS = sorted(path for family in FAMILIES for path in (EXAMPLES / family / "model_training").glob(
    "*/**/*.py") if path.parent.name in ("validate_lora", "validate_full") or path.name == "validate.py")


def training_script(path: Path) -> Path:
    """The training script a validate script reads the output of."""
    if path.name == "validate.py":  # a special/ run's, the one training script beside it
        [script] = path.parent.glob("*.sh")
        return script
    return path.parents[1] / ("full" if path.parent.name == "validate_full" else "lora") / f"{path.stem}.sh"


def flag_values(words: list[str], flag: str) -> list[str]:
    return [words[index + 1] for index, word in enumerate(words) if word == flag]


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda path: str(path.relative_to(EXAMPLES)))
def test_every_script_reads_the_files_its_training_script_writes(path):
    script = release_script(path)
    if path.name != "validate.py":
        assert script.name == path.stem and script.full == (path.parent.name == "validate_full")
    words = shlex.split(training_script(path).read_text(), comments=True)
    trained = {entry for value in flag_values(words, "--model_id_with_origin_paths") for entry in value.split(",")}
    assert set(script.models.split(",")) == trained
    assert Path(script.trained).parent == Path(flag_values(words, "--output_path")[-1])
    assert script.tokenizer == next(iter(flag_values(words, "--tokenizer_path")), None)
    assert set(script.required) <= set(script.inputs) and Path(script.output).suffix in IMAGE_SUFFIXES


# One script of each family and kind of input: (script, its input flags, image side in pixels). A UNet's first step
# from pure noise hardly reads its prediction: two steps.
RUNS = {
    "qwen_image-edit-list": ("qwen_image/model_training/validate_lora/Qwen-Image-Edit-2509.py",
                             ["--edit_image", "red.png", "blue.png"], 16),
    "qwen_image-context": ("qwen_image/model_training/validate_lora/Qwen-Image-In-Context-Control-Union.py",
                           ["--context_image", "red.png"], 16),
    "z_image-controlnet-full": ("z_image/model_training/validate_full/Z-Image-Turbo-Fun-Controlnet-Union-2.1.py",
                                ["--controlnet_image", "red.png"], 16),
    "z_image-special": ("z_image/model_training/special/differential_training/validate.py", [], 16),
    "flux-kontext": ("flux/model_training/validate_lora/FLUX.1-Kontext-dev.py", ["--kontext_images", "red.png"], 16),
    "flux2": ("flux2/model_training/validate_lora/FLUX.2-klein-base-4B.py", [], 16),
    "stable_diffusion": ("stable_diffusion/model_training/validate_lora/stable-diffusion-v1-5.py", ["--steps", "2"],
                         32),
    "stable_diffusion_xl-full": ("stable_diffusion_xl/model_training/validate_full/stable-diffusion-xl-base-1.0.py",
                                 ["--steps", "2"], 32),
    "krea2": ("krea2/model_training/validate_lora/Krea-2-Turbo.py", [], 16),
    "ernie_image": ("ernie_image/model_training/validate_lora/ERNIE-Image.py", [], 16),
    # A short prompt: the reference's JSON caption is a thousand tokens.
    "ideogram4": ("ideogram4/model_training/validate_lora/Ideogram-4-bf16-repackage.py", ["--prompt", "a dog"], 16),
    "joyai_image-edit": ("joyai_image/model_training/validate_lora/JoyAI-Image-Edit.py", ["--edit_image", "red.png"],
                         16),
}


@pytest.fixture
def small_inputs(monkeypatch, tmp_path):
    """Two 16 x 16 images in the working folder, and reference images kept small (the releases fit them to about a
    megapixel, which the tiny models would take seconds to encode)."""
    from diffsynth.pipelines.flux import pipeline as flux_pipeline
    from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline

    monkeypatch.chdir(tmp_path)
    Image.new("RGB", (16, 16), (220, 40, 40)).save("red.png")
    Image.new("RGB", (16, 16), (40, 40, 220)).save("blue.png")
    monkeypatch.setattr(QwenImagePipeline, "edit_image_pixels", 32 * 32)
    monkeypatch.setattr(QwenImagePipeline, "edit_condition_pixels", 32 * 32)
    monkeypatch.setattr(flux_pipeline, "kontext_size", lambda image, auto_resize: image.size)


def pixels(image: Path | Image.Image) -> np.ndarray:
    return np.asarray((image if isinstance(image, Image.Image) else Image.open(image)).convert("RGB"), dtype=np.int16)


def write_trained(script) -> int:
    """A file changing every linear layer of the script's model: a rank-2 LoRA, or (``full``) new weights; returns
    how many. The layer names come from the models built without weights (on the meta device)."""
    from diffsynth.core import parse_model_id_with_origin_paths
    from diffsynth.pipelines.registry import load

    configs = parse_model_id_with_origin_paths(script.models)
    pipe = load(script.pipeline).from_pretrained(torch_dtype="float32", model_configs=configs, skeleton_configs=configs)
    generator = torch.Generator().manual_seed(0)
    tensors = {}
    for name, layer in getattr(pipe, script.slots[0]).named_modules():
        if not isinstance(layer, torch.nn.Linear):
            continue
        scale = 2 / layer.in_features ** 0.5  # a few times a fresh layer's weights
        if script.full:
            tensors[f"{name}.weight"] = scale * torch.randn(layer.weight.shape, generator=generator)
        else:
            tensors[f"{name}.lora_A.weight"] = torch.randn(2, layer.in_features, generator=generator)
            tensors[f"{name}.lora_B.weight"] = scale * torch.randn(layer.out_features, 2, generator=generator)
    save_file(tensors, "trained.safetensors")
    return len(tensors) if script.full else len(tensors) // 2


STRENGTH_0 = "qwen_image-edit-list"


@pytest.mark.parametrize("case", list(RUNS))
def test_a_script_renders_the_base_model_at_strength_0_and_the_trained_one_at_1(case, base, small_inputs, capsys):
    relative, inputs, side = RUNS[case]
    script = release_script(EXAMPLES / relative)
    layers = write_trained(script)
    # Few steps without guidance: what is checked is the trained weights' effect, not the sampler.
    argv = ["--checkpoint_path" if script.full else "--lora_path", "trained.safetensors", "--height", str(side),
            "--width", str(side), "--steps", "1", "--cfg_scale", "1", "--device", "cpu", "--torch_dtype", "float32",
            *inputs]
    # The left picture is rendered before the weights change, from the same load: the base model's.
    if case == STRENGTH_0:  # the merge at a strength is the families' shared code: strength 0 once
        script.main([*argv, "--lora_alpha_scale", "0", "--output", "base.png", "--before_after", "base_after.png"])
        before, after, _ = (pixels(Image.open("base_after.png").crop(box)) for box in panel_boxes((side, side)))
        assert np.array_equal(before, after) and np.array_equal(after, pixels("base.png"))
    output = script.main([*argv, "--output", "trained.png", "--before_after", "before_after.png"])
    before, after, _ = (pixels(Image.open("before_after.png").crop(box)) for box in panel_boxes((side, side)))
    assert output == Path("trained.png") and np.array_equal(after, pixels(output))
    assert after.shape == (side, side, 3) and np.abs(after - before).mean() > 5, "the image did not change"
    if case == STRENGTH_0:
        assert np.array_equal(pixels("base.png"), before)
    done = f"loaded {layers} weights" if script.full else f"merged {layers} LoRA layers"
    assert f"{done} from trained.safetensors into {script.slots[0]}" in capsys.readouterr().out


@pytest.mark.parametrize(("flags", "error"), [
    (["--lora_path", "missing.safetensors"], "--lora_path missing.safetensors: no such file"),
    (["--output", "image.gif"], "--output image.gif: the suffix picks the format; end it in .png or"),
    ([], "Qwen-Image-Edit-2509 needs --edit_image: --edit_image: the image(s) to edit"),
    (["--edit_image", "gone.png"], "--edit_image gone.png: no such file"),
    (["--edit_image", "lora.safetensors", "--processor_path", "gone"], "--processor_path gone: no such folder"),
])  # fmt: skip
def test_bad_flags_fail_before_loading(flags, error, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("lora.safetensors").touch()
    module = release_script(EXAMPLES / "qwen_image/model_training/validate_lora/Qwen-Image-Edit-2509.py")
    with pytest.raises(SystemExit):
        module.main(["--lora_path", "lora.safetensors", *flags])
    assert error in capsys.readouterr().err
