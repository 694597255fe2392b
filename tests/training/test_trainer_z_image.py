"""The CLI trainer on the tiny Z-Image-Turbo: what the family kit (``tests/pipelines/test_family_kit.py``) does not
check: the LoRA's layers, batches with padded prompts, samples while training, fp8 and NF4 storage, Omni-Base.

Runs go through ``trainer.main`` with a real argv (the entry ``examples/z_image/model_training/train.py`` calls).
"""

import json

import pytest
import torch

from diffsynth.testing.tiny_z_image import Z_IMAGE_OMNI_MODEL_ID, Z_IMAGE_PATTERNS, Z_IMAGE_TURBO_MODEL_ID
from diffsynth.pipelines.z_image.pipeline import ZImagePipeline
from diffsynth.training.entry import main
from tests.conftest import reset_accelerate_state
from tests.core.test_quant import needs_bitsandbytes
from tests.training.conftest import lora, max_difference, run_once
from tests.training.test_trainer_batches import write_same_ratio_dataset

PATTERN = {name: f"{Z_IMAGE_TURBO_MODEL_ID}:{Z_IMAGE_PATTERNS[name]}" for name in ("dit", "text_encoder", "vae")}
COMMON = [
    "--model_id_with_origin_paths", ",".join(PATTERN.values()), "--torch_dtype", "float32", "--seed", "3",
    "--learning_rate", "1e-3", "--height", "32", "--width", "32", "--use_gradient_checkpointing",
    "--remove_prefix_in_ckpt", "pipe.dit.", "--num_epochs", "1", "--dataset_repeat", "2",
]  # fmt: skip
LORA = ["--lora_base_model", "dit", "--lora_target_modules", "to_q,to_k,to_v,to_out.0,w1,w2,w3", "--lora_rank", "4"]


@pytest.fixture(autouse=True)
def in_process_runs(base, fresh_accelerate_state):
    """Every test here runs the trainer in-process on the tiny repos."""


def raw(dataset):
    return ["--dataset_base_path", str(dataset), "--dataset_metadata_path", str(dataset / "metadata.csv")]


def train(dataset, output, *extra):
    return main(ZImagePipeline, [*raw(dataset), *COMMON, *LORA, "--output_path", str(output), *extra])


@pytest.fixture(scope="module")
def reference(dataset, tmp_path_factory, tiny_root):
    """One-stage plain LoRA training: what the other ways of training must reproduce."""
    return run_once(tiny_root, tmp_path_factory.mktemp("reference"), lambda output: train(dataset, output))


def test_a_lora_trains(reference):
    output, result = reference
    assert result["global_step"] == 6 and all(torch.isfinite(torch.tensor(result["losses"])))
    weights = lora(output, "epoch-0")
    # 7 targets in each of the 2 main blocks and the 2 refiners, two factors each.
    assert len(weights) == 7 * 4 * 2 and all(key.startswith("diffusion_model.") for key in weights)
    assert any(key.startswith("diffusion_model.layers.1.attention.to_q.") for key in weights)
    assert max(weights[key].abs().max().item() for key in weights if "lora_B" in key) > 1e-4


def test_a_batch_of_padded_prompts_trains_what_accumulation_trains(tmp_path, caplog):
    # One aspect ratio, captions of different lengths: each batch pads its prompts with a mask.
    data = write_same_ratio_dataset(tmp_path / "data", sizes=((48, 32), (96, 64), (144, 96), (192, 128)))
    flags = ["--aspect_ratio_buckets", "--max_pixels", "1536"]
    accumulated = train(data, tmp_path / "accumulated", *flags, "--gradient_accumulation_steps", "2")
    with caplog.at_level("INFO", logger="diffsynth.training.objective.batches"):
        batched = train(data, tmp_path / "batched", *flags, "--batch_size", "2")
    assert "8 samples in 1 bucket, batch size 2, 4 batches per epoch" in caplog.text
    assert batched["losses"] == pytest.approx(accumulated["losses"], abs=2e-5)
    assert max_difference(lora(tmp_path / "batched", "epoch-0"), lora(tmp_path / "accumulated", "epoch-0")) < 2e-5


def test_samples_are_rendered_while_training(dataset, tmp_path):
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps([{"prompt": "a red cube", "height": 32, "width": 32}]))
    train(dataset, tmp_path / "out", "--validation_prompts", str(prompts), "--validation_num_inference_steps", "2",
          "--validation_epochs", "1")
    samples = sorted((tmp_path / "out" / "samples").rglob("*.png"))
    assert samples, "no sample was rendered"


def test_fp8_storage_trains_a_lora(dataset, tmp_path):
    from diffsynth.core.fp8 import Fp8Linear

    result = train(dataset, tmp_path / "out", "--fp8_models", PATTERN["dit"])
    dit = result["module"].pipe.dit
    assert isinstance(dit.layers[0].attention.to_q.base_layer, Fp8Linear)
    # The timestep embedder casts its input to its weight dtype, so it keeps its dtype.
    assert type(dit.t_embedder.mlp[0]) is torch.nn.Linear
    assert all(torch.isfinite(torch.tensor(result["losses"])))
    assert max(v.abs().max().item() for k, v in lora(tmp_path / "out", "epoch-0").items() if "lora_B" in k) > 1e-4


@needs_bitsandbytes
def test_nf4_quantization_trains_a_lora(dataset, tmp_path):
    import bitsandbytes as bnb

    result = train(dataset, tmp_path / "out", "--quant_options", f"{PATTERN['dit']}:bitsandbytes_nf4")
    assert isinstance(result["module"].pipe.dit.layers[0].attention.to_q.base_layer, bnb.nn.Linear4bit)
    assert all(torch.isfinite(torch.tensor(result["losses"])))
    assert max(v.abs().max().item() for k, v in lora(tmp_path / "out", "epoch-0").items() if "lora_B" in k) > 1e-4


OMNI = [f"{Z_IMAGE_OMNI_MODEL_ID}:{Z_IMAGE_PATTERNS[name]}" for name in ("dit", "siglip")]
OMNI_MODELS = ",".join([*OMNI, PATTERN["text_encoder"], PATTERN["vae"]])


def omni_argv(data, metadata, output, *extra):
    """The reference's Omni-Base command (its models, Turbo's text encoder and VAE), made tiny."""
    models_at = COMMON.index("--model_id_with_origin_paths") + 1
    common = [*COMMON[:models_at], OMNI_MODELS, *COMMON[models_at + 1:]]
    return ["--dataset_base_path", str(data), "--dataset_metadata_path", str(metadata), *common, *LORA,
            "--find_unused_parameters", "--output_path", str(output), *extra]


def test_omni_base_trains_a_lora_from_text_alone_that_every_tool_loads(dataset, tmp_path, tiny_root):
    from diffusers import ZImageOmniPipeline

    from diffsynth.lora import inspect_lora
    from tests.conftest import load_lora_into_diffusers

    result = main(ZImagePipeline, omni_argv(dataset, dataset / "metadata.csv", tmp_path / "omni"))
    assert result["module"].pipe.siglip is not None
    assert result["global_step"] == 6 and all(torch.isfinite(torch.tensor(result["losses"])))
    weights = lora(tmp_path / "omni", "epoch-0")
    assert max(weights[key].abs().max().item() for key in weights if "lora_B" in key) > 1e-4
    file = tmp_path / "omni" / "epoch-0.safetensors"
    inspection = inspect_lora(file)
    assert not inspection.failing(), inspection.format()  # diffsynth, diffusers, ComfyUI, DiffSynth-Studio
    pipe = ZImageOmniPipeline.from_pretrained(str(tiny_root / Z_IMAGE_OMNI_MODEL_ID), dtype=torch.float32)
    assert load_lora_into_diffusers(pipe, file, "omni") == []
    assert len([m for m in pipe.transformer.modules() if hasattr(m, "scaling")]) == len(weights) // 2


def test_omni_base_trains_on_condition_images_and_they_change_the_loss(tmp_path):
    from diffsynth.core.data.example_edit_dataset import build_example_edit_dataset

    metadata = build_example_edit_dataset(tmp_path / "edit", num_samples=2, num_edit_images=2)
    extra = ["--data_file_keys", "image,edit_image", "--max_train_steps", "2"]
    with_images = main(ZImagePipeline, omni_argv(metadata.parent, metadata, tmp_path / "with", *extra,
                                                 "--extra_inputs", "edit_image"))
    reset_accelerate_state()
    without = main(ZImagePipeline, omni_argv(metadata.parent, metadata, tmp_path / "without", *extra))
    assert with_images["global_step"] == 2 and all(torch.isfinite(torch.tensor(with_images["losses"])))
    # The same samples, timesteps and noise: only the condition images differ between the two runs.
    assert abs(with_images["losses"][0] - without["losses"][0]) > 1e-6
