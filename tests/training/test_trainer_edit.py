"""Qwen-Image-Edit training through the CLI trainer on the tiny Edit repos: the edit images reach the LoRA, two-stage
training equals one-stage, offload / block swap / fp8 give the plain LoRA, diffusers' edit pipeline loads the LoRA,
and bad edit data fails before any model loads.

The edit images are sized to 64 x 64 pixels instead of the reference's 1024 x 1024 (``edit_image_pixels``), which
would cost the tiny VAE seconds per sample on a CPU; nothing else changes with the size.
"""

import json
import shutil

import pytest
import torch
from PIL import Image, ImageOps

from diffsynth.core.data import DataFileNotFoundError, DatasetError
from diffsynth.core.data.example_edit_dataset import build_example_edit_dataset
from diffsynth.lora import read_lora
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.testing.tiny_models import (
    QWEN_IMAGE_EDIT_2509_MODEL_ID,
    QWEN_IMAGE_EDIT_2511_MODEL_ID,
    QWEN_IMAGE_EDIT_MODEL_ID,
    QWEN_IMAGE_MODEL_ID,
    QWEN_IMAGE_PATTERNS,
)
from diffsynth.training.config.errors import FlagError
from diffsynth.training.entry import main
from tests.conftest import reset_accelerate_state
from tests.pipelines.edit_reference import diffusers_edit_pipeline, shrink_reference_sizes
from tests.training.conftest import lora, max_difference

TARGETS = "to_q,to_k,to_v,add_q_proj,to_out.0,img_mlp.net.2,txt_mod.1"
SHARED_MODELS = [f"{QWEN_IMAGE_MODEL_ID}:{QWEN_IMAGE_PATTERNS[name]}" for name in ("text_encoder", "vae")]


def dit(model_id):
    return f"{model_id}:{QWEN_IMAGE_PATTERNS['dit']}"


def common(model_id):
    """The reference Edit scripts' model list (transformer from the Edit repo, the rest from Qwen-Image)."""
    return [
        "--model_id_with_origin_paths", ",".join([dit(model_id), *SHARED_MODELS]), "--lora_base_model", "dit",
        "--lora_target_modules", TARGETS, "--lora_rank", "4", "--learning_rate", "1e-3", "--torch_dtype", "float32",
        "--seed", "3", "--max_pixels", "4096", "--use_gradient_checkpointing", "--data_file_keys", "image,edit_image",
        "--extra_inputs", "edit_image",
    ]  # fmt: skip


@pytest.fixture(autouse=True)
def small_edit_images(base, fresh_accelerate_state, monkeypatch):
    """In-process runs on the tiny repos, with 64 x 64-pixel edit images."""
    monkeypatch.setattr(QwenImagePipeline, "edit_image_pixels", 64 * 64)
    monkeypatch.setattr(QwenImagePipeline, "edit_condition_pixels", 64 * 64)


@pytest.fixture(scope="module")
def pair_dataset(tmp_path_factory):
    """Two samples with two edit images each, in metadata.json (lists) and metadata.csv (comma-separated)."""
    return build_example_edit_dataset(tmp_path_factory.mktemp("pairs"), num_samples=2, num_edit_images=2)


def raw(metadata):
    return ["--dataset_base_path", str(metadata.parent), "--dataset_metadata_path", str(metadata)]


def one_stage(metadata, output, model_id=QWEN_IMAGE_EDIT_2509_MODEL_ID, *extra):
    return main(QwenImagePipeline, [*raw(metadata), *common(model_id), "--output_path", str(output),
                                    "--num_epochs", "2", *extra])


@pytest.fixture(scope="module")
def reference(pair_dataset, tmp_path_factory, tiny_root):
    """One-stage 2509 training on the two-image dataset: the LoRA every other way of training must reproduce."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        patch.setattr(QwenImagePipeline, "edit_image_pixels", 64 * 64)
        patch.setattr(QwenImagePipeline, "edit_condition_pixels", 64 * 64)
        output = tmp_path_factory.mktemp("reference") / "out"
        result = one_stage(pair_dataset, output)
    reset_accelerate_state()
    return output, result


def test_training_reads_the_edit_images(reference, pair_dataset, tmp_path):
    output, result = reference
    assert result["global_step"] == 4
    # Same targets and prompts, other edit images: another LoRA. (Before edit support the column was ignored and
    # both runs wrote the same file.)
    other = tmp_path / "other"
    shutil.copytree(pair_dataset.parent, other)
    for path in other.glob("edit_*.png"):
        ImageOps.mirror(ImageOps.invert(Image.open(path).convert("RGB"))).save(path)
    one_stage(other / pair_dataset.name, tmp_path / "out")
    assert max_difference(lora(tmp_path / "out"), lora(output)) > 1e-5


def test_csv_lists_train_like_json_lists(reference, pair_dataset, tmp_path):
    one_stage(pair_dataset.parent / "metadata.csv", tmp_path / "out")
    assert max_difference(lora(tmp_path / "out"), lora(reference[0])) < 1e-6


@pytest.mark.parametrize("offload", [[], ["--enable_model_cpu_offload"]], ids=["plain", "offload"])
def test_two_stage_edit_training_gives_the_one_stage_lora(reference, pair_dataset, tmp_path, offload):
    cache = tmp_path / "cache"
    stage_one = main(QwenImagePipeline, [*raw(pair_dataset), *common(QWEN_IMAGE_EDIT_2509_MODEL_ID), "--output_path",
                                         str(cache), "--task", "sft:data_process", "--offload_models",
                                         dit(QWEN_IMAGE_EDIT_2509_MODEL_ID), *offload])
    assert stage_one["cached"] == 2
    main(QwenImagePipeline, ["--dataset_base_path", str(cache), *common(QWEN_IMAGE_EDIT_2509_MODEL_ID),
                             "--output_path", str(tmp_path / "out"), "--task", "sft:train", "--num_epochs", "2",
                             "--offload_models", ",".join(SHARED_MODELS), *offload])
    # Stage 1 cached the prompt-and-image embeddings and the reference latents; stage 2 trained from them alone.
    info = json.loads((cache / "cache_info.json").read_text())
    assert ["shared", "edit_latents"] in info["cache_keys"] and ["posi", "prompt_emb"] in info["cache_keys"]
    assert max_difference(lora(tmp_path / "out"), lora(reference[0])) < 1e-6


@pytest.mark.parametrize("mode", [["--enable_model_cpu_offload"], ["--blocks_to_swap", "1"],
                                  ["--blocks_to_swap", "2", "--block_swap_h2d_only"]],
                         ids=["offload", "block_swap", "h2d_stream"])
def test_offload_and_block_swap_give_the_plain_lora(reference, pair_dataset, tmp_path, mode):
    one_stage(pair_dataset, tmp_path / "out", QWEN_IMAGE_EDIT_2509_MODEL_ID, *mode)
    assert max_difference(lora(tmp_path / "out"), lora(reference[0])) < 1e-6


def test_block_swap_keeps_2511s_zero_cond_t(pair_dataset, tmp_path):
    # zero_cond_t doubles the timestep batch and hands every block a modulation index; swapped blocks must pass it.
    for name, mode in (("plain", []), ("swap", ["--blocks_to_swap", "2", "--block_swap_h2d_only"])):
        one_stage(pair_dataset, tmp_path / name, QWEN_IMAGE_EDIT_2511_MODEL_ID, "--num_epochs", "1", *mode)
    assert max_difference(lora(tmp_path / "plain", "epoch-0"), lora(tmp_path / "swap", "epoch-0")) < 1e-6


def test_fp8_trains_an_edit_lora(pair_dataset, tmp_path):
    result = one_stage(pair_dataset, tmp_path / "out", QWEN_IMAGE_EDIT_2509_MODEL_ID, "--fp8_models",
                       dit(QWEN_IMAGE_EDIT_2509_MODEL_ID), "--num_epochs", "1")
    assert result["global_step"] == 2
    assert max(value.abs().max().item() for key, value in lora(tmp_path / "out", "epoch-0").items()
               if "lora_B" in key) > 1e-5


def test_the_lora_loads_into_diffusers_edit_pipeline(reference, tiny_root, monkeypatch):
    from diffusers import QwenImageEditPlusPipeline
    shrink_reference_sizes(monkeypatch, 64 * 64, 64 * 64)
    pipe = diffusers_edit_pipeline(QwenImageEditPlusPipeline, tiny_root / QWEN_IMAGE_EDIT_2509_MODEL_ID)
    image = Image.new("RGB", (64, 48), (200, 30, 90))

    def generate():
        return pipe(image=[image], prompt="paint it blue", height=32, width=32, num_inference_steps=2,
                    true_cfg_scale=1.0, generator=torch.Generator().manual_seed(0), output_type="pt").images

    before = generate()
    pipe.load_lora_weights(str(reference[0] / "epoch-1.safetensors"), adapter_name="edit")
    trained = read_lora(reference[0] / "epoch-1.safetensors").layers
    # Every layer of the file lands on a LoRA layer of the transformer with the update the file holds, and every
    # LoRA layer got one.
    loaded = {name: module for name, module in pipe.transformer.named_modules() if hasattr(module, "scaling")}
    assert loaded.keys() == trained.keys()
    for name, module in loaded.items():
        delta = module.scaling["edit"] * module.lora_B["edit"].weight @ module.lora_A["edit"].weight
        torch.testing.assert_close(delta.detach(), trained[name].delta(), atol=1e-6, rtol=1e-5)
    assert (generate() - before).abs().max() > 1e-4


def test_one_edit_image_per_row_trains_qwen_image_edit(tmp_path):
    metadata = build_example_edit_dataset(tmp_path / "data", num_samples=2, num_edit_images=1)
    result = one_stage(metadata.parent / "metadata.csv", tmp_path / "out", QWEN_IMAGE_EDIT_MODEL_ID,
                       "--num_epochs", "1")
    assert result["global_step"] == 2 and (tmp_path / "out" / "epoch-0.safetensors").is_file()


def test_zero_cond_t_changes_what_2511_learns(pair_dataset, tmp_path):
    flagged = one_stage(pair_dataset, tmp_path / "flagged", QWEN_IMAGE_EDIT_2509_MODEL_ID, "--zero_cond_t",
                        "--num_epochs", "1")
    assert flagged["module"].pipe.dit.zero_cond_t is True
    one_stage(pair_dataset, tmp_path / "plain", QWEN_IMAGE_EDIT_2509_MODEL_ID, "--num_epochs", "1")
    assert max_difference(lora(tmp_path / "flagged", "epoch-0"), lora(tmp_path / "plain", "epoch-0")) > 1e-6
    # 2511's transformer config turns it on by itself; the flag changes nothing there.
    one_stage(pair_dataset, tmp_path / "2511", QWEN_IMAGE_EDIT_2511_MODEL_ID, "--num_epochs", "1")
    one_stage(pair_dataset, tmp_path / "2511_flag", QWEN_IMAGE_EDIT_2511_MODEL_ID, "--zero_cond_t", "--num_epochs", "1")
    assert max_difference(lora(tmp_path / "2511", "epoch-0"), lora(tmp_path / "2511_flag", "epoch-0")) == 0


def fail_before_loading(monkeypatch):
    from diffsynth.core.loader import loading

    monkeypatch.setattr(loading, "load_model_from_files", lambda *a, **k: pytest.fail("weights were loaded"))


def test_edit_images_missing_from_data_file_keys_fail_before_loading(pair_dataset, tmp_path, monkeypatch):
    fail_before_loading(monkeypatch)
    argv = [*raw(pair_dataset), *common(QWEN_IMAGE_EDIT_2509_MODEL_ID), "--output_path", str(tmp_path / "out"),
            "--data_file_keys", "image"]
    with pytest.raises(FlagError, match="--extra_inputs edit_image takes images.*--data_file_keys image,edit_image"):
        main(QwenImagePipeline, argv)


@pytest.mark.parametrize(("broken", "error", "fragment"), [
    ("missing", DataFileNotFoundError, "does not exist"),
    ("unreadable", DatasetError, "is not an image PIL can read"),
])
def test_a_bad_edit_image_is_named_with_its_row(pair_dataset, tmp_path, monkeypatch, broken, error, fragment):
    fail_before_loading(monkeypatch)
    data = tmp_path / "data"
    shutil.copytree(pair_dataset.parent, data)
    path = data / json.loads((data / "metadata.json").read_text())[1]["edit_image"][1]
    if broken == "missing":
        path.unlink()
    else:
        path.write_bytes(b"not a png")
    for metadata in ("metadata.json", "metadata.csv"):
        with pytest.raises(error, match=rf"{metadata} row 2 column 'edit_image'.*{path.name}.*{fragment}"):
            one_stage(data / metadata, tmp_path / "out")


def test_pipeline_flags_are_refused_where_they_do_nothing(tmp_path, monkeypatch):
    from diffsynth.core.data.example_dataset import build_example_video_dataset
    from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline
    from diffsynth.testing.tiny_models import WAN_MODEL_ID, WAN_PATTERNS

    fail_before_loading(monkeypatch)
    metadata = build_example_video_dataset(tmp_path / "videos", num_videos=1, num_frames=5)
    argv = [*raw(metadata), "--model_id_with_origin_paths", f"{WAN_MODEL_ID}:{WAN_PATTERNS['dit']}",
            "--lora_base_model", "dit", "--lora_target_modules", "to_q", "--num_frames", "5", "--output_path",
            str(tmp_path / "out"), "--zero_cond_t", "--processor_path", str(tmp_path / "nowhere")]
    with pytest.raises(FlagError) as raised:
        main(WanVideoPipeline, argv, video=True)
    assert "--processor_path" in str(raised.value) and "is not a folder" in str(raised.value)
    assert "--zero_cond_t does not apply to WanVideoPipeline" in str(raised.value)
