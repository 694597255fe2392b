"""The trainer end to end on the tiny FLUX.1 repos, loaded from the released single files as the reference's scripts
name them, beyond the family kit's checks (``tests/pipelines/test_family_kit.py``): LoRA on the reference's module
names, Kontext training, fp8 and NF4, samples, and the fused BFL layout of ``--align_to_opensource_format``."""

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from diffsynth.core.data.example_edit_dataset import build_example_edit_dataset
from diffsynth.pipelines.flux.pipeline import FluxPipeline
from diffsynth.testing.tiny_flux import FLUX1_DEV_MODEL_ID as DEV
from diffsynth.testing.tiny_flux import FLUX1_KONTEXT_MODEL_ID as KONTEXT
from diffsynth.training.config.errors import FlagError
from diffsynth.training.entry import main
from tests.training.conftest import assert_samples_while_training, dataset_args, quant_cases, reference_lora, run_once

PATTERN = {"dit": f"{DEV}:flux1-dev.safetensors", "text_encoder": f"{DEV}:text_encoder/model.safetensors",
           "text_encoder_2": f"{DEV}:text_encoder_2/*.safetensors", "vae": f"{DEV}:ae.safetensors"}
# The reference's own module names, as its FLUX.1 scripts give them.
TARGETS = "a_to_qkv,b_to_qkv,ff_a.0,ff_a.2,ff_b.0,ff_b.2,a_to_out,b_to_out,proj_out,norm.linear,norm1_a.linear," \
          "norm1_b.linear,to_qkv_mlp"
COMMON = [
    "--lora_base_model", "dit", "--lora_target_modules", TARGETS, "--lora_rank", "4", "--learning_rate", "1e-3",
    "--torch_dtype", "float32", "--seed", "3", "--max_pixels", "1024", "--use_gradient_checkpointing",
    "--remove_prefix_in_ckpt", "pipe.dit.",
]  # fmt: skip


# Every test here runs the trainer in-process on the tiny repos.
pytestmark = pytest.mark.usefixtures("base", "fresh_accelerate_state")


def raw(dataset, models=",".join(PATTERN.values())):
    return dataset_args(dataset, models)


def one_stage(dataset, output, *extra):
    return main(FluxPipeline, [*raw(dataset), *COMMON, "--output_path", str(output), "--num_epochs", "1", *extra])


@pytest.fixture(scope="module")
def reference(dataset, tmp_path_factory, tiny_root):
    """One-stage plain LoRA training: what the other ways of training must reproduce."""
    return run_once(tiny_root, tmp_path_factory.mktemp("flux_reference"), lambda output: one_stage(dataset, output))


def block_counts(result):
    dit = result["module"].pipe.dit
    return len(dit.transformer_blocks), len(dit.single_transformer_blocks)


def test_a_lora_run_trains_every_target_of_the_reference_names(reference):
    weights = reference_lora(reference, 3)
    double, single = block_counts(reference[1])
    # 14 layers per double block and 6 per single block (its fused to_qkv_mlp is to_q, to_k, to_v and proj_mlp).
    assert len(weights) == 2 * (14 * double + 6 * single)
    assert max(value.abs().max().item() for key, value in weights.items() if "lora_B" in key) > 1e-4


def test_kontext_training_reads_the_reference_images(tmp_path):
    metadata = build_example_edit_dataset(tmp_path / "kontext", num_samples=2, column="kontext_images")
    models = ",".join([f"{KONTEXT}:flux1-kontext-dev.safetensors", *(PATTERN[name] for name in
                                                                       ("text_encoder", "text_encoder_2", "vae"))])
    argv = ["--dataset_base_path", str(metadata.parent), "--dataset_metadata_path",
            str(metadata.with_suffix(".csv")), "--model_id_with_origin_paths", models, *COMMON, "--data_file_keys",
            "image,kontext_images", "--extra_inputs", "kontext_images", "--height", "32", "--width", "48",
            "--output_path", str(tmp_path / "out"), "--num_epochs", "1"]
    result = main(FluxPipeline, argv)
    assert result["global_step"] == 2
    pipe = result["module"].pipe
    sample = {"image": Image.new("RGB", (48, 32)), "prompt": "p", "kontext_images": Image.new("RGB", (40, 24))}
    state = pipe.run_units(*pipe.training_inputs(sample, ["kontext_images"]))
    # Kontext images keep their own size in training (the reference's rule), cut to multiples of 16.
    assert [tuple(latents.shape) for latents in state[0]["kontext_latents"]] == [(1, 16, 2, 4)]


def test_unknown_reference_names_are_refused_before_loading(dataset, tmp_path):
    with pytest.raises(FlagError, match="a_to_kqv"):
        main(FluxPipeline, [*raw(dataset), *COMMON, "--lora_target_modules", "a_to_qkv,a_to_kqv", "--output_path",
                            str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("quant", quant_cases(PATTERN["dit"]))
def test_fp8_and_nf4_train(dataset, tmp_path, quant):
    result = one_stage(dataset, tmp_path / "out", "--torch_dtype", "bfloat16", *quant)
    assert result["global_step"] == 3 and all(torch.isfinite(torch.tensor(result["losses"])))


def test_samples_while_training(dataset, tmp_path):
    assert_samples_while_training(lambda output, *flags: one_stage(dataset, output, *flags), tmp_path)


def test_the_opensource_format_is_the_same_lora_in_bfl_fused_names(reference, dataset, tmp_path):
    from diffsynth.lora import lora_layer_names, naming_for, read_lora
    from diffsynth.lora.inspect import inspect_lora

    result = one_stage(dataset, tmp_path / "out", "--align_to_opensource_format")
    file = tmp_path / "out" / "epoch-0.safetensors"
    keys = set(load_file(str(file)))
    assert all(key.startswith("lora_unet_") for key in keys)
    assert "lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight" in keys
    assert "lora_unet_single_blocks_0_linear1.lora_up.weight" in keys
    dit = result["module"].pipe.dit
    names, naming = lora_layer_names(dit), naming_for(dit)
    fused, plain = read_lora(file, names, naming), read_lora(reference[0] / "epoch-0.safetensors", names, naming)
    # Split back from the fused layers, every trained layer's update is the one of the default layout's file.
    assert fused.layers.keys() == plain.layers.keys()
    assert max((fused.layers[name].delta() - plain.layers[name].delta()).abs().max().item()
               for name in plain.layers) < 1e-6
    inspection = inspect_lora(file, dit)
    assert inspection.result("ComfyUI").ok and inspection.result("DiffSynth-Studio").ok
