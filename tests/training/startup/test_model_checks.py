"""The flags that name models or their parts are checked on weightless builds, all at once, before any weight loads."""

import pytest

from diffsynth.core.loader import ModelConfig, load_skeleton
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID, QWEN_IMAGE_PATTERNS
from diffsynth.training.config.errors import FlagError
from diffsynth.training.entry import main
from tests.training.conftest import quant_cases
from tests.training.test_trainer import COMMON, PATTERN, raw


@pytest.fixture(autouse=True)
def no_weights(base, fresh_accelerate_state, monkeypatch):
    """Loading any weight fails the test: every problem here must be found before."""
    from diffsynth.core.loader import loading

    monkeypatch.setattr(loading, "load_model_from_files", lambda *a, **k: pytest.fail("weights were loaded"))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from diffsynth.core.data.example_dataset import build_example_dataset

    folder = tmp_path_factory.mktemp("dataset")
    build_example_dataset(folder, num_images=1)
    return folder


def problems_of(dataset, tmp_path, *extra):
    with pytest.raises(FlagError) as error:
        main(QwenImagePipeline, [*raw(dataset), *COMMON, "--output_path", str(tmp_path / "out"), *extra])
    assert not (tmp_path / "out").exists()
    return error.value.problems


def test_models_that_are_not_loaded_are_named_with_the_models_that_are(dataset, tmp_path):
    missing_fp8 = "Qwen/Qwen-Image:nothing/*.safetensors"
    problems = problems_of(dataset, tmp_path, "--lora_base_model", "unet", "--trainable_models", "dit,vae2",
                           "--fp8_models", missing_fp8)
    assert len(problems) == 3, problems
    loaded = "the models loaded are: dit, text_encoder, vae"
    assert problems[0].startswith(f"--fp8_models entries ['{missing_fp8}'] are not among the models loaded")
    assert problems[1].startswith("--trainable_models dit,vae2: ['vae2'] name no loaded model")
    assert problems[2].startswith("--lora_base_model unet: ['unet'] name no loaded model")
    assert loaded in problems[1] and loaded in problems[2]


def test_targets_block_swap_and_fp8_conflicts_are_reported_together(dataset, tmp_path):
    dit = ModelConfig(model_id=QWEN_IMAGE_MODEL_ID, origin_file_pattern=QWEN_IMAGE_PATTERNS["dit"])
    blocks = len(load_skeleton(dit).transformer_blocks)
    problems = problems_of(dataset, tmp_path, "--lora_target_modules", "to_q,nothing", "--blocks_to_swap",
                           str(blocks + 1), "--trainable_models", "dit", "--fp8_models", PATTERN["dit"])
    assert len(problems) == 3, problems
    assert problems[0].startswith("--fp8_models includes ['dit'], which --trainable_models trains in full")
    assert problems[1].startswith("--lora_target_modules entries ['nothing'] match no module of dit")
    assert problems[2] == (f"--blocks_to_swap {blocks + 1}, but dit (QwenImageTransformer2DModel) has only {blocks} "
                           f"blocks in transformer_blocks; pass at most --blocks_to_swap {blocks}")


@pytest.mark.parametrize("storage", quant_cases(PATTERN["dit"]))
def test_dora_on_a_compressed_base_is_refused_before_any_weight_loads(dataset, tmp_path, storage):
    flag, value = storage
    assert problems_of(dataset, tmp_path, "--use_dora", *storage) == [
        f"--use_dora with --lora_base_model dit, whose weights {flag} {value} stores compressed: DoRA reads the base "
        f"weights as they are every step; drop --use_dora (a plain LoRA trains on {flag}), or drop dit's entry from "
        f"{flag}"]


def test_dora_on_a_stage_whose_every_model_is_compressed_is_refused_with_the_flags(tmp_path, capsys):
    from diffsynth.training.config import RunConfig
    from diffsynth.training.config.parsers import build_parser

    missing = "nobody/missing-model:transformer.safetensors"  # neither on disk nor downloadable: never looked for
    argv = ["--dataset_base_path", str(tmp_path), "--task", "sft:train", "--output_path", str(tmp_path / "out"),
            "--model_id_with_origin_paths", missing, "--lora_base_model", "dit", "--lora_target_modules", "to_q",
            "--use_dora", "--fp8_models", missing]
    with pytest.raises(SystemExit) as exit_info:
        main(QwenImagePipeline, argv)
    assert exit_info.value.code == 2
    assert ("--use_dora with --lora_base_model dit, whose weights --fp8_models / --quant_options store compressed "
            "(they name every model this run loads): DoRA reads the base weights as they are every step; drop "
            "--use_dora (a plain LoRA trains on them), or drop the storage flag") in " ".join(
        capsys.readouterr().err.split())
    # Stage 1 trains nothing: its compressed encoders are no reason to refuse the split run's repeated --use_dora.
    stage_one = [*argv[:3], "sft:data_process", *argv[4:], "--dataset_metadata_path", str(tmp_path / "m.csv")]
    assert RunConfig.from_namespace(build_parser().parse_args(stage_one)).lora.use_dora


def test_dora_beside_a_compressed_text_encoder_is_not_refused(dataset, tmp_path):
    # A wrong target makes the run stop here; DoRA on the full-precision dit is not among the problems.
    (problem,) = problems_of(dataset, tmp_path, "--use_dora", "--fp8_models", PATTERN["text_encoder"],
                             "--lora_target_modules", "nothing")
    assert problem.startswith("--lora_target_modules entries ['nothing'] match no module of dit")


def test_empty_lora_targets_are_reported(dataset, tmp_path):
    assert problems_of(dataset, tmp_path, "--lora_target_modules", " , ") == [
        "--lora_base_model dit needs --lora_target_modules, e.g. 'to_q,to_k,to_v,to_out.0'"]


def test_the_second_wan22_expert_is_dit2_as_loading_names_it(base):
    from diffsynth.core.loader import parse_model_configs
    from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline
    from diffsynth.testing.tiny_models import WAN22_A14B_PATTERNS, WAN22_T2V_MODEL_ID
    from diffsynth.training.config.parsers import parse_args
    from diffsynth.training.startup.model_checks import check_model_flags

    def check(*flags):
        models = ",".join(f"{WAN22_T2V_MODEL_ID}:{pattern}" for pattern in WAN22_A14B_PATTERNS.values())
        args = parse_args(["--model_id_with_origin_paths", models, "--dataset_metadata_path", "m.csv",
                           "--lora_target_modules", "q,k", *flags], video=True)
        configs = parse_model_configs(args.model.model_paths, args.model.model_id_with_origin_paths)
        check_model_flags(args, WanVideoPipeline, configs)

    check("--lora_base_model", "dit2")
    with pytest.raises(FlagError) as error:  # the fp8 entry is the low-noise expert's file: dit2, not dit
        check("--lora_base_model", "dit", "--trainable_models", "dit2", "--fp8_models",
              f"{WAN22_T2V_MODEL_ID}:{WAN22_A14B_PATTERNS['dit2']}")
    assert error.value.problems[0].startswith("--fp8_models includes ['dit2'], which --trainable_models trains in full")
