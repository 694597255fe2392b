"""The trainer end to end on the tiny FLUX.2 [klein] repos: LoRA and full runs, Edit training, the two-stage split,
offloaded and block-swapped training giving the plain LoRA, batches, samples, fp8 and NF4, and the LoRA in diffusers'
own ``load_lora_weights``."""

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from diffsynth.core.data.example_edit_dataset import build_example_edit_dataset
from diffsynth.pipelines.flux2_klein.pipeline import Flux2KleinPipeline
from diffsynth.testing.tiny_flux2 import FLUX2_KLEIN_4B_MODEL_ID as SHARED
from diffsynth.testing.tiny_flux2 import FLUX2_KLEIN_BASE_4B_MODEL_ID as BASE
from diffsynth.testing.tiny_flux2 import FLUX2_PATTERNS
from diffsynth.training.config.errors import FlagError
from diffsynth.training.entry import main
from tests.conftest import reset_accelerate_state
from tests.core.test_quant import needs_bitsandbytes
from tests.training.conftest import lora, max_difference

PATTERN = {"dit": f"{BASE}:{FLUX2_PATTERNS['dit']}", "text_encoder": f"{SHARED}:{FLUX2_PATTERNS['text_encoder']}",
           "vae": f"{SHARED}:{FLUX2_PATTERNS['vae']}"}
TARGETS = "to_q,to_k,to_v,to_out.0,add_q_proj,to_add_out,linear_in,linear_out,to_qkv_mlp_proj," + ",".join(
    f"single_transformer_blocks.{index}.attn.to_out" for index in range(20))
COMMON = [
    "--lora_base_model", "dit", "--lora_target_modules", TARGETS, "--lora_rank", "4", "--learning_rate", "1e-3",
    "--torch_dtype", "float32", "--seed", "3", "--max_pixels", "1024", "--use_gradient_checkpointing",
    "--remove_prefix_in_ckpt", "pipe.dit.", "--tokenizer_path", f"{SHARED}:tokenizer/",
]  # fmt: skip


@pytest.fixture(autouse=True)
def in_process_runs(base, fresh_accelerate_state):
    """Every test here runs the trainer in-process on the tiny repos."""


def raw(dataset, models=",".join(PATTERN.values())):
    return ["--dataset_base_path", str(dataset), "--dataset_metadata_path", str(dataset / "metadata.csv"),
            "--model_id_with_origin_paths", models]


def one_stage(dataset, output, *extra):
    return main(Flux2KleinPipeline, [*raw(dataset), *COMMON, "--output_path", str(output), "--num_epochs", "1",
                                     *extra])


@pytest.fixture(scope="module")
def reference(dataset, tmp_path_factory, tiny_root):
    """One-stage plain LoRA training: what the other ways of training must reproduce."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        output = tmp_path_factory.mktemp("flux2_reference") / "out"
        result = one_stage(dataset, output)
    reset_accelerate_state()
    return output, result


def test_a_lora_run_trains_every_target(reference):
    output, result = reference
    assert result["global_step"] == 3 and all(torch.isfinite(torch.tensor(result["losses"])))
    weights = lora(output, "epoch-0")
    # 2 double blocks x 10 layers (linear_in / linear_out in ff and ff_context), 20 single blocks x
    # (to_qkv_mlp_proj + to_out): 60 layers, 2 factors each.
    assert len(weights) == 2 * (2 * 10 + 20 * 2)
    assert max(value.abs().max().item() for key, value in weights.items() if "lora_B" in key) > 1e-4


# The tiny klein-base-4B has 2 double blocks, then 20 single ones: block swap counts over all 22, so 21 swaps the
# second double block and every single one, and 6 streams transformer_blocks.1 and 5 single blocks.
@pytest.mark.parametrize("mode", [["--enable_model_cpu_offload"], ["--blocks_to_swap", "21"],
                                  ["--blocks_to_swap", "6", "--block_swap_h2d_only"]], ids=" ".join)
def test_offload_and_block_swap_give_the_plain_lora(reference, dataset, tmp_path, mode):
    one_stage(dataset, tmp_path / "out", *mode)
    # Offload's forward is bit-identical here; in backward, the gradients that FLUX.2's shared modulation layers gather
    # from every block may add up in another order, which on some CPUs moves the LoRA after three Adam steps by up to
    # 2e-6 (an error in the offload would move it by orders of magnitude more).
    assert max_difference(lora(tmp_path / "out", "epoch-0"), lora(reference[0], "epoch-0")) < 1e-5


def test_more_blocks_to_swap_than_both_lists_hold_is_refused_before_loading(dataset, tmp_path):
    with pytest.raises(FlagError) as error:
        one_stage(dataset, tmp_path / "out", "--blocks_to_swap", "23")
    expected = ("--blocks_to_swap 23, but dit (Flux2Transformer2DModel) has only 22 blocks in "
                "transformer_blocks + single_transformer_blocks; pass at most --blocks_to_swap 22")
    assert error.value.problems == [expected]


def test_two_stage_training_gives_the_one_stage_lora(reference, dataset, tmp_path):
    cache = tmp_path / "cache"
    stage_one = main(Flux2KleinPipeline, [*raw(dataset, f"{PATTERN['text_encoder']},{PATTERN['vae']}"), *COMMON,
                                          "--output_path", str(cache), "--task", "sft:data_process"])
    assert stage_one["cached"] == 3
    main(Flux2KleinPipeline, ["--dataset_base_path", str(cache), "--model_id_with_origin_paths", PATTERN["dit"],
                              *COMMON, "--output_path", str(tmp_path / "out"), "--task", "sft:train",
                              "--num_epochs", "1"])
    assert max_difference(lora(tmp_path / "out", "epoch-0"), lora(reference[0], "epoch-0")) < 1e-6


def test_the_lora_loads_fully_into_diffusers_and_equals_the_merged_weights(reference, tiny_root):
    from diffusers import Flux2KleinPipeline as DiffusersFlux2KleinPipeline

    from diffsynth.lora import load_lora

    def render(pipe):
        return pipe(prompt="a shape", height=32, width=32, num_inference_steps=2, guidance_scale=1.0,
                    generator=torch.Generator().manual_seed(0), output_type="pt").images

    pipe = DiffusersFlux2KleinPipeline.from_pretrained(str(tiny_root / BASE), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    before = render(pipe)
    # The universal file names FLUX.2's layers bare, as ComfyUI reads them; diffusers reads the twin beside it.
    file = reference[0] / "epoch-0.diffusers.safetensors"
    assert not any(key.startswith("diffusion_model.") for key in load_file(str(reference[0] / "epoch-0.safetensors")))
    pipe.load_lora_weights(str(file))
    loaded = {name for name, _ in pipe.transformer.named_parameters() if "lora_A" in name}
    assert len(loaded) == len([key for key in load_file(str(file)) if "lora_A" in key])
    with_lora = render(pipe)
    pipe.unload_lora_weights()
    load_lora(pipe.transformer, file)  # merged into the weights at strength 1.0
    assert (with_lora - before).abs().max() > 1e-4
    assert (render(pipe) - with_lora).abs().max() < 1e-4


def test_full_training_updates_the_transformer(dataset, tmp_path):
    result = main(Flux2KleinPipeline, [*raw(dataset), "--trainable_models", "dit", "--learning_rate", "1e-3",
                                       "--torch_dtype", "float32", "--max_pixels", "1024", "--output_path",
                                       str(tmp_path / "out"), "--num_epochs", "1", "--remove_prefix_in_ckpt",
                                       "pipe.dit."])
    weights = load_file(str(tmp_path / "out" / "epoch-0.safetensors"))
    assert result["global_step"] == 3 and "single_transformer_blocks.19.attn.to_out.weight" in weights


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
    (tmp_path / "prompts.txt").write_text("a red square\n")
    result = one_stage(dataset, tmp_path / "out", "--batch_size", "3", "--height", "32", "--width", "32",
                       "--validation_prompts", str(tmp_path / "prompts.txt"), "--validation_steps", "1",
                       "--validation_num_inference_steps", "1")
    assert result["global_step"] == 1
    assert list((tmp_path / "out").rglob("*.png"))


@pytest.mark.parametrize("quant", [["--fp8_models", PATTERN["dit"]],
                                   pytest.param(["--quant_options", f"{PATTERN['dit']}:bitsandbytes_nf4"],
                                                marks=needs_bitsandbytes)],
                         ids=["fp8", "nf4"])
def test_fp8_and_nf4_train(dataset, tmp_path, quant):
    result = one_stage(dataset, tmp_path / "out", "--torch_dtype", "bfloat16", *quant)
    assert result["global_step"] == 3 and all(torch.isfinite(torch.tensor(result["losses"])))
