"""The reference's Z-Image commands (DiffSynth-Studio fed7b18, ``examples/z_image/model_training``) run as written on
the tiny repos through the trainer's ``main``, and the ones for features not supported here stop with one line.

Each ``accelerate launch`` command runs from a scratch working folder with only what a user on a small machine would
change: the dataset (drawn at the path the script names), sizes, epochs and repeats, and ``DIFFSYNTH_MODEL_BASE_PATH``
pointing at the tiny repos. The full fine-tunes' DeepSpeed configs (8 GPUs, ZeRO-2 and ZeRO-3) are checked to parse
and to be accepted by accelerate's own config reader rather than launched: a DeepSpeed launch on this CPU costs a JIT
build of half a minute; their commands train here in-process, as one process.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from diffsynth.lora.formats import LoRALayer, LoRAWeights, write_lora
from diffsynth.lora.naming import naming_for
from diffsynth.pipelines.z_image.pipeline import ZImagePipeline
from tests.core.test_quant import needs_bitsandbytes
from tests.examples.helpers import assert_deepspeed_config, lora_update, run_command, script_commands
from tests.pipelines.family_helpers import refused_before_loading

from .test_scripts import REPO

Z_IMAGE = REPO / "examples" / "z_image" / "model_training"
PRESET = "models/ostris/zimage_turbo_training_adapter/zimage_turbo_training_adapter_v1.safetensors"


def commands(relative: str) -> list[tuple[Path | None, list[str]]]:
    """``(accelerate config or None, trainer argv)`` of each launch command of a script, sizes made small."""
    return script_commands(Z_IMAGE, relative)


def run_in_process(argv: list[str]) -> dict:
    return run_command(ZImagePipeline, argv)


@pytest.mark.parametrize(("script", "output"), [
    ("lora/Z-Image.sh", "Z-Image_lora"), ("lora/Z-Image-Turbo.sh", "Z-Image-Turbo_lora"),
])
def test_lora_scripts_train(workdir, script, output):
    [(config, argv)] = commands(script)
    assert config is None
    result = run_in_process(argv)
    assert result["global_step"] == 2 and all(torch.isfinite(torch.tensor(result["losses"])))
    assert lora_update(workdir / f"models/train/{output}/epoch-0.safetensors") > 0
    # The base model's transformer trains with Turbo's text encoder and VAE, as the reference loads them.
    assert result["module"].pipe.model_configs["text_encoder"].model_id == "Tongyi-MAI/Z-Image-Turbo"


@pytest.mark.parametrize(("script", "release"), [("full/Z-Image.sh", "Tongyi-MAI/Z-Image"),
                                                 ("full/Z-Image-Turbo.sh", "Tongyi-MAI/Z-Image-Turbo")])
def test_full_scripts_train_the_transformer(workdir, script, release):
    [(config, argv)] = commands(script)
    assert config == Z_IMAGE / "full/accelerate_config.yaml"
    result = run_in_process(argv)
    assert result["module"].pipe.model_configs["dit"].model_id == release
    assert all(torch.isfinite(torch.tensor(result["losses"])))
    name = release.split("/")[1]
    weights = (workdir / f"models/train/{name}_full/epoch-0.safetensors")
    assert weights.is_file()


def omni_commands(relative: str) -> list[list[str]]:
    """The text-to-image command of an Omni-Base script and its commented image(s)-to-image one, made small."""
    text = (Z_IMAGE / relative).read_text()
    plain, _, edit = text.partition("# Image(s) to image training\n")
    found = []
    for section in (plain, re.sub(r"^# ?", "", edit, flags=re.MULTILINE)):
        [(_, argv)] = script_commands(Z_IMAGE, relative, text=section)
        found.append(argv)
    return found


def draw_condition_dataset(argv: list[str]) -> None:
    """Two samples with two condition images each, at the path an image(s)-to-image command names."""
    from diffsynth.core.data.example_edit_dataset import build_example_edit_dataset

    base = argv[argv.index("--dataset_base_path") + 1]
    if not Path(base).is_dir():
        build_example_edit_dataset(base, num_samples=2, num_edit_images=2)


@pytest.mark.parametrize("script", ["lora/Z-Image-Omni-Base.sh", "full/Z-Image-Omni-Base.sh"])
def test_omni_base_scripts_train_from_text_and_from_condition_images(workdir, script):
    text_to_image, images_to_image = omni_commands(script)
    draw_condition_dataset(images_to_image)
    for argv in (text_to_image, images_to_image):
        result = run_in_process(argv)
        pipe = result["module"].pipe
        assert pipe.model_configs["dit"].model_id == "Tongyi-MAI/Z-Image-Omni-Base" and pipe.siglip is not None
        assert result["global_step"] >= 1 and all(torch.isfinite(torch.tensor(result["losses"])))
        output = workdir / argv[argv.index("--output_path") + 1] / "epoch-0.safetensors"
        assert (lora_update(output) if script.startswith("lora") else output.stat().st_size) > 0


@pytest.mark.parametrize(("name", "stage"), [("accelerate_config.yaml", 2), ("accelerate_config_zero3.yaml", 3)])
def test_the_deepspeed_configs_are_accepted_by_accelerate(name, stage):
    assert_deepspeed_config(Z_IMAGE / "full" / name, stage)


def write_preset_lora(workdir: Path, tiny_root: Path) -> Path:
    """A LoRA on every attention projection of the tiny Turbo transformer, where the script expects the adapter."""
    from diffusers import ZImageTransformer2DModel

    dit = ZImageTransformer2DModel.from_pretrained(str(tiny_root / "Tongyi-MAI/Z-Image-Turbo/transformer"))
    generator = torch.Generator().manual_seed(0)
    layers = {name: LoRALayer(torch.randn(2, module.in_features, generator=generator) * 0.1,
                              torch.randn(module.out_features, 2, generator=generator) * 0.1)
              for name, module in dit.named_modules() if name.endswith(("attention.to_q", "attention.to_v"))}
    path = workdir / PRESET
    path.parent.mkdir(parents=True)
    write_lora(path, LoRAWeights(layers), "universal", naming_for(dit))
    return path


def test_differential_script_merges_the_preset_adapter(workdir, tiny_root, caplog):
    write_preset_lora(workdir, tiny_root)
    [(_, argv)] = commands("special/differential_training/Z-Image-Turbo.sh")
    with caplog.at_level("INFO", logger="diffsynth.training.objective.training_module"):
        result = run_in_process(argv)
    assert f"--preset_lora_path {PRESET}: merged into 8 layers of dit" in caplog.text  # 2 targets x 4 blocks
    assert result["global_step"] == 2
    assert lora_update(workdir / "models/train/Z-Image-Turbo_lora_differential/epoch-0.safetensors") > 0


@needs_bitsandbytes
def test_nf4_script_trains_on_4_bit_transformer_and_text_encoder(workdir):
    import bitsandbytes as bnb

    [(_, argv)] = commands("special/quant_training/Z-Image-Turbo-bitsandbytes_nf4.sh")
    result = run_in_process(argv)
    pipe = result["module"].pipe
    assert isinstance(pipe.dit.layers[0].attention.to_q.base_layer, bnb.nn.Linear4bit)
    assert any(isinstance(module, bnb.nn.Linear4bit) for module in pipe.text_encoder.modules())
    assert lora_update(workdir / "models/train/Z-Image-Turbo_quant_lora/epoch-0.safetensors") > 0


TURBO = ("Tongyi-MAI/Z-Image-Turbo:transformer/*.safetensors,Tongyi-MAI/Z-Image-Turbo:text_encoder/*.safetensors,"
         "Tongyi-MAI/Z-Image-Turbo:vae/diffusion_pytorch_model.safetensors")
DATA = ["--dataset_base_path", "data/d", "--dataset_metadata_path", "data/d/metadata.csv", "--max_pixels", "1048576"]
LORA = ["--lora_base_model", "dit", "--lora_target_modules", "to_q,to_k,to_v,to_out.0,w1,w2,w3", "--lora_rank", "32"]
# The distinguishing flags of the reference's scripts for features not supported here, as they write them.
REFUSED = {
    "ZImage-i2L-v2": (
        [*DATA, "--model_id_with_origin_paths", TURBO, "--enable_lora_hot_loading", "--template_model_id_or_path",
         "DiffSynth-Studio/ZImage-i2L-v2:", "--extra_inputs", "template_inputs", "--trainable_models",
         "template_model"], "image-to-LoRA (i2L)"),
    "trajectory_imitation/Z-Image-Turbo": (
        [*DATA, "--model_id_with_origin_paths", TURBO, *LORA, "--lora_checkpoint",
         "./models/train/Z-Image-Turbo_lora/epoch-4.safetensors", "--task", "trajectory_imitation", "--save_steps",
         "10"], "trajectory imitation"),
}


@pytest.mark.parametrize("script", list(REFUSED))
def test_unsupported_scripts_stop_with_one_line_before_loading(workdir, script, capsys):
    argv, reason = REFUSED[script]
    assert reason in refused_before_loading(ZImagePipeline, argv, workdir, capsys)


def draw_control_dataset(argv: list[str]) -> None:
    """Two samples, each with a control image (``controlnet_image``), where a Fun ControlNet command expects them."""
    from diffsynth.core.data.example_edit_dataset import build_example_edit_dataset

    base = argv[argv.index("--dataset_base_path") + 1]
    if not Path(base).is_dir():
        build_example_edit_dataset(base, num_samples=2, column="controlnet_image")


def test_controlnet_lora_script_trains_the_transformer_with_the_controlnet_in_place(workdir):
    [(_, argv)] = commands("lora/Z-Image-Turbo-Fun-Controlnet-Union-2.1.sh")
    draw_control_dataset(argv)
    result = run_command(ZImagePipeline, argv, draw=lambda _: None)
    pipe = result["module"].pipe
    assert type(pipe.controlnet).__name__ == "ZImageControlNetModel"
    assert not any(param.requires_grad for param in pipe.controlnet.parameters())
    assert result["global_step"] == 2 and all(torch.isfinite(torch.tensor(result["losses"])))
    assert lora_update(workdir / "models/train/Z-Image-Turbo-Fun-Controlnet-Union-2.1_lora/epoch-0.safetensors") > 0


@pytest.mark.parametrize("placement", [["--enable_model_cpu_offload"], ["--blocks_to_swap", "1"]])
def test_controlnet_offload_and_block_swap_are_refused_before_loading(workdir, placement, monkeypatch):
    from diffsynth.core.loader import loading
    from diffsynth.training.config.errors import FlagError

    monkeypatch.setattr(loading, "load_model_from_files", lambda *a, **k: pytest.fail("weights were loaded"))
    [(_, argv)] = commands("lora/Z-Image-Turbo-Fun-Controlnet-Union-2.1.sh")
    draw_control_dataset(argv)
    with pytest.raises(FlagError, match=f"{placement[0]}.* does not place the controlnet model yet"):
        run_command(ZImagePipeline, [*argv, *placement], draw=lambda _: None)


def test_controlnet_full_script_trains_the_controlnet_alone(workdir, tiny_root):
    from safetensors.torch import load_file

    [(_, argv)] = commands("full/Z-Image-Turbo-Fun-Controlnet-Tile-2.1-8steps.sh")
    # float32 and a seed, so that the two-stage run below can be compared far below one step's change.
    argv = [*argv, "--torch_dtype", "float32", "--seed", "3"]
    draw_control_dataset(argv)
    result = run_command(ZImagePipeline, argv, draw=lambda _: None)
    assert result["global_step"] == 2 and all(torch.isfinite(torch.tensor(result["losses"])))
    output = workdir / "models/train/Z-Image-Turbo-Fun-Controlnet-Tile-2.1-8steps_full"
    written = load_file(str(output / "epoch-0.safetensors"))
    released = load_file(str(tiny_root / "PAI/Z-Image-Turbo-Fun-Controlnet-Union-2.1"
                             / "Z-Image-Turbo-Fun-Controlnet-Tile-2.1-8steps.safetensors"))
    # The file holds the ControlNet alone, under the release's names (the transformer's lent parts stay out), and
    # the weights moved.
    assert set(written) == set(released)
    assert max((written[key].float() - released[key].float()).abs().max() for key in released) > 0
    # Split in two stages (the control latents cached with the prompt and the image), it trains the same weights.
    cache, two_stage = workdir / "cache", workdir / "two_stage"
    stage_one = run_command(ZImagePipeline, [*replaced(argv, "--output_path", str(cache)), "--task",
                                             "sft:data_process"], draw=lambda _: None)
    assert stage_one["cached"] == 2
    stage_two = replaced(replaced(argv, "--output_path", str(two_stage)), "--dataset_base_path", str(cache))
    metadata = stage_two.index("--dataset_metadata_path")
    run_command(ZImagePipeline, [*stage_two[:metadata], *stage_two[metadata + 2:], "--task", "sft:train"],
                draw=lambda _: None)
    split = load_file(str(two_stage / "epoch-0.safetensors"))
    assert max((split[key] - written[key]).abs().max() for key in written) < 1e-7


def replaced(argv: list[str], flag: str, value: str) -> list[str]:
    index = argv.index(flag)
    return [*argv[:index + 1], value, *argv[index + 2:]]
