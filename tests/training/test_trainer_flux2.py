"""The trainer end to end on the tiny FLUX.2 [klein] repos, beyond the family kit's checks
(``tests/pipelines/test_family_kit.py``): the LoRA's layers, the block-swap limit, Edit training, batches, samples, fp8
and NF4."""

import pytest
import torch
from PIL import Image

from diffsynth.core.data.example_edit_dataset import build_example_edit_dataset
from diffsynth.pipelines.flux2_klein.pipeline import Flux2KleinPipeline
from diffsynth.testing.tiny_flux2 import FLUX2_KLEIN_4B_MODEL_ID as SHARED
from diffsynth.testing.tiny_flux2 import FLUX2_KLEIN_BASE_4B_MODEL_ID as BASE
from diffsynth.testing.tiny_flux2 import FLUX2_PATTERNS
from diffsynth.training.config.errors import FlagError
from diffsynth.training.entry import main
from tests.training.conftest import assert_samples_while_training, dataset_args, quant_cases, reference_lora, run_once

PATTERN = {"dit": f"{BASE}:{FLUX2_PATTERNS['dit']}", "text_encoder": f"{SHARED}:{FLUX2_PATTERNS['text_encoder']}",
           "vae": f"{SHARED}:{FLUX2_PATTERNS['vae']}"}
TARGETS = "to_q,to_k,to_v,to_out.0,add_q_proj,to_add_out,linear_in,linear_out,to_qkv_mlp_proj," + ",".join(
    f"single_transformer_blocks.{index}.attn.to_out" for index in range(20))
COMMON = [
    "--lora_base_model", "dit", "--lora_target_modules", TARGETS, "--lora_rank", "4", "--learning_rate", "1e-3",
    "--torch_dtype", "float32", "--seed", "3", "--max_pixels", "1024", "--use_gradient_checkpointing",
    "--remove_prefix_in_ckpt", "pipe.dit.", "--tokenizer_path", f"{SHARED}:tokenizer/",
]  # fmt: skip


# Every test here runs the trainer in-process on the tiny repos.
pytestmark = pytest.mark.usefixtures("base", "fresh_accelerate_state")


def raw(dataset, models=",".join(PATTERN.values())):
    return dataset_args(dataset, models)


def one_stage(dataset, output, *extra):
    return main(Flux2KleinPipeline, [*raw(dataset), *COMMON, "--output_path", str(output), "--num_epochs", "1",
                                     *extra])


@pytest.fixture(scope="module")
def reference(dataset, tmp_path_factory, tiny_root):
    """One-stage plain LoRA training: what the other ways of training must reproduce."""
    return run_once(tiny_root, tmp_path_factory.mktemp("flux2_reference"), lambda output: one_stage(dataset, output))


def test_a_lora_run_trains_every_target(reference):
    weights = reference_lora(reference, 3)
    # 2 double blocks x 10 layers (linear_in / linear_out in ff and ff_context), 20 single blocks x
    # (to_qkv_mlp_proj + to_out): 60 layers, 2 factors each.
    assert len(weights) == 2 * (2 * 10 + 20 * 2)
    assert max(value.abs().max().item() for key, value in weights.items() if "lora_B" in key) > 1e-4


def test_more_blocks_to_swap_than_both_lists_hold_is_refused_before_loading(dataset, tmp_path):
    with pytest.raises(FlagError) as error:
        one_stage(dataset, tmp_path / "out", "--blocks_to_swap", "23")
    expected = ("--blocks_to_swap 23, but dit (Flux2Transformer2DModel) has only 22 blocks in "
                "transformer_blocks + single_transformer_blocks; pass at most --blocks_to_swap 22")
    assert error.value.problems == [expected]


def test_edit_training_reads_the_reference_images(tmp_path):
    metadata = build_example_edit_dataset(tmp_path / "edit", num_samples=2, num_edit_images=2)
    argv = ["--dataset_base_path", str(metadata.parent), "--dataset_metadata_path", str(metadata),
            "--model_id_with_origin_paths", ",".join(PATTERN.values()), *COMMON, "--data_file_keys",
            "image,edit_image", "--extra_inputs", "edit_image", "--height", "64", "--width", "64", "--output_path",
            str(tmp_path / "out"), "--num_epochs", "1"]
    result = main(Flux2KleinPipeline, argv)
    assert result["global_step"] == 2
    pipe = result["module"].pipe
    sample = {"image": Image.new("RGB", (64, 64)), "prompt": "p", "edit_image": [Image.new("RGB", (64, 64))] * 2}
    state = pipe.run_units(*pipe.training_inputs(sample, ["edit_image"]))
    assert [tuple(latents.shape) for latents in state[0]["edit_latents"]] == [(1, 128, 4, 4)] * 2


def test_batches_from_buckets_and_samples_while_training(dataset, tmp_path):
    assert_samples_while_training(lambda output, *flags: one_stage(dataset, output, *flags), tmp_path)


@pytest.mark.parametrize("quant", quant_cases(PATTERN["dit"]))
def test_fp8_and_nf4_train(dataset, tmp_path, quant):
    result = one_stage(dataset, tmp_path / "out", "--torch_dtype", "bfloat16", *quant)
    assert result["global_step"] == 3 and all(torch.isfinite(torch.tensor(result["losses"])))
