"""``--quant_options``: parsing, the checks made before any model loads, and an NF4 base under a LoRA that learns.

The training tests need bitsandbytes (optional) and are skipped without it; they run on the CPU with it.
"""

import pytest
import torch

from diffsynth.core.loader import load_skeleton, parse_model_id_with_origin_paths
from diffsynth.core.quant import QuantConfig, bitsandbytes_available
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.training.config import RunConfig
from diffsynth.training.config.errors import FlagError
from diffsynth.training.config.parsers import build_parser, parse_args
from diffsynth.training.entry import main
from diffsynth.training.placement.quant_options import parse_quant_options, quant_model_problems, quant_package_problems
from tests.core.test_quant import REFERENCE_EXCLUDE, needs_bitsandbytes
from tests.training.test_trainer import ALL_MODELS, COMMON, PATTERN, raw

NF4 = f"{PATTERN['dit']}:bitsandbytes_nf4/{','.join(REFERENCE_EXCLUDE)}"


def run_config(argv):
    """The config of ``argv`` without the checks of what a run needs (a model, a dataset)."""
    return RunConfig.from_namespace(build_parser().parse_args(argv), runnable=False)


def flag_problems(argv):
    """The problems the config of ``argv`` is refused with."""
    with pytest.raises(FlagError) as error:
        run_config(argv)
    return error.value.problems


def test_entries_parse_as_in_the_reference():
    options = parse_quant_options(f"{NF4};{PATTERN['vae']}:bitsandbytes_nf4;")
    assert options == {PATTERN["dit"]: QuantConfig("bitsandbytes_nf4", REFERENCE_EXCLUDE),
                       PATTERN["vae"]: QuantConfig("bitsandbytes_nf4")}
    with pytest.raises(ValueError, match="is not <model>:<method>"):
        parse_quant_options("bitsandbytes_nf4")
    with pytest.raises(ValueError, match="'nf3' is unknown; the known methods are: bitsandbytes_nf4"):
        parse_quant_options(f"{PATTERN['dit']}:nf3")
    with pytest.raises(ValueError, match="names Qwen/Qwen-Image:vae/.* twice"):
        parse_quant_options(f"{PATTERN['vae']}:bitsandbytes_nf4;{PATTERN['vae']}:bitsandbytes_nf4")


def test_flag_problems_name_the_fix(capsys):
    from diffsynth.training.startup.launch_checks import launch_problems
    from tests.training.startup.test_launch_checks import FakeAccelerator

    problems = flag_problems(["--quant_options", NF4, "--enable_model_cpu_offload"])
    assert "--quant_options and --enable_model_cpu_offload cannot be combined" in problems[0]
    planned = flag_problems(["--quant_options", NF4, "--vram_budget", "24"])
    assert "--quant_options and --vram_budget cannot be combined" in planned[0]
    (refused,) = launch_problems(run_config(["--quant_options", NF4]), FakeAccelerator(deepspeed={}))
    assert "--quant_options and DeepSpeed cannot be combined" in refused
    # A release packed 4-bit loads so without the flag: the same refusals name it, and DoRA over it.
    packed = ["--model_id_with_origin_paths", "ideogram-ai/ideogram-4-nf4:transformer/*.safetensors"]
    swapped = flag_problems([*packed, "--blocks_to_swap", "2", "--lora_base_model", "dit", "--use_dora"])
    assert "the 4-bit release ideogram-ai/ideogram-4-nf4 and --blocks_to_swap cannot be combined" in swapped[0]
    assert any("--use_dora with --lora_base_model dit of the 4-bit release" in problem for problem in swapped)
    (refused,) = launch_problems(run_config(packed), FakeAccelerator(deepspeed={}))
    assert "the 4-bit release ideogram-ai/ideogram-4-nf4 and DeepSpeed cannot be combined" in refused
    assert run_config(["--model_id_with_origin_paths", "ideogram-ai/ideogram-4-fp8:transformer/*.safetensors",
                       "--blocks_to_swap", "2"]).placement.blocks_to_swap == 2  # teeth: fp8 weights move
    with pytest.MonkeyPatch.context() as patch:  # a machine without bitsandbytes stops before loading it
        patch.setattr("diffsynth.training.placement.quant_options.bitsandbytes_available", lambda: False)
        (missing,) = quant_package_problems(None, packed[1])
        assert missing.startswith("ideogram-ai/ideogram-4-nf4 is packed in bitsandbytes' 4-bit layout")
        assert quant_package_problems(None, ALL_MODELS) == []
    with pytest.raises(SystemExit):
        parse_args(["--model_id_with_origin_paths", ALL_MODELS, "--lora_base_model", "dit", "--dataset_metadata_path",
                    "m.csv", "--quant_options", f"{PATTERN['dit']}:bitsandbytes_int8"])
    assert "'bitsandbytes_int8' is unknown" in capsys.readouterr().err


@pytest.mark.skipif(bitsandbytes_available(), reason="checks the message for a machine without bitsandbytes")
def test_a_missing_bitsandbytes_stops_the_trainer_before_anything_loads(dataset, tmp_path, base,
                                                                       fresh_accelerate_state):
    argv = [*raw(dataset), *COMMON, "--output_path", str(tmp_path / "out"), "--quant_options", NF4]
    assert "needs bitsandbytes, which is not installed" in quant_package_problems(build_parser().parse_args(argv).quant_options)[0]
    with pytest.raises(FlagError, match="pip install -c constraints.txt bitsandbytes"):
        main(QwenImagePipeline, argv)


def test_model_problems_are_found_on_skeletons(base):
    configs = parse_model_id_with_origin_paths(ALL_MODELS)
    slots = dict(zip(("dit", "text_encoder", "vae"), configs))
    dit = load_skeleton(slots["dit"])
    args = run_config(["--quant_options", f"{NF4};Qwen/Qwen-Image:nothing/*:bitsandbytes_nf4",
                       "--trainable_models", "dit", "--fp8_models", PATTERN["dit"]])
    problems = quant_model_problems(args.model, args.training.trainable, configs, slots, True, {"dit": dit})
    assert any("entry 'Qwen/Qwen-Image:nothing/*' is not among the models loaded" in p for p in problems)
    assert any("quantizes ['dit'], which --trainable_models trains in full" in p for p in problems)
    assert any("--quant_options and --fp8_models both name ['dit']" in p for p in problems)
    args = run_config(["--quant_options", f"{PATTERN['dit']}:bitsandbytes_nf4/img_mod.9"])
    assert quant_model_problems(args.model, args.training.trainable, configs, slots, True, {"dit": dit}) == [
        "--quant_options for dit: exclude entries ['img_mod.9'] match no Linear layer of QwenImageTransformer2DModel; "
        "name layers by their dotted path or its end, e.g. ['time_text_embed.timestep_embedder.linear_1', "
        "'time_text_embed.timestep_embedder.linear_2']"]


@needs_bitsandbytes
def test_an_nf4_base_trains_a_lora_whose_loss_falls(dataset, tmp_path, base, fresh_accelerate_state):
    import bitsandbytes as bnb

    from diffsynth.core.data import UnifiedDataset
    from diffsynth.training.objective.loss import FlowMatchSFTLoss

    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "metadata.csv").write_text("image,prompt\nimage_000.png,a shape\n")
    (tmp_path / "one" / "image_000.png").write_bytes((dataset / "image_000.png").read_bytes())
    result = main(QwenImagePipeline, [*raw(tmp_path / "one"), *COMMON, "--output_path", str(tmp_path / "out"),
                                      "--dataset_repeat", "60", "--learning_rate", "1e-2", "--quant_options", NF4])
    pipe = result["module"].pipe
    assert isinstance(pipe.dit.transformer_blocks[0].attn.to_q.base_layer, bnb.nn.Linear4bit)
    sample = UnifiedDataset(tmp_path / "one", tmp_path / "one" / "metadata.csv", max_pixels=4096)[0]
    state = pipe.run_units(*pipe.training_inputs(sample))

    def mean_loss():  # the same timesteps and noise each time: only the LoRA differs
        with torch.no_grad():
            return sum(FlowMatchSFTLoss()(pipe, *state, generator=torch.Generator().manual_seed(i)).item()
                       for i in range(16)) / 16

    trained = mean_loss()
    with torch.no_grad():
        for name, param in pipe.dit.named_parameters():
            if "lora_B" in name:
                param.zero_()  # the LoRA's initial state: no update
    assert trained < 0.8 * mean_loss()
