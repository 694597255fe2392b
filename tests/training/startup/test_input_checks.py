"""No silently ignored input: extra inputs nothing reads and flags without effect are refused before models load."""

import logging

import pytest

from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline
from diffsynth.training.config import RunConfig
from diffsynth.training.config.errors import FlagError
from diffsynth.training.config.parsers import build_parser
from diffsynth.training.entry import main
from diffsynth.training.objective.loss import DirectDistillLoss, FlowMatchSFTLoss
from diffsynth.training.startup.input_checks import (
    check_inputs_used,
    flag_effect_problems,
    inputs_that_matter,
    warn_about_unread_columns,
)
from tests.training.test_trainer import COMMON, raw

DISTILL = ["seed", "rand_device", "num_inference_steps", "cfg_scale"]


def flags(*argv, video=False, metadata=True):
    """The run config of a LoRA command plus ``argv`` (``metadata``: with a metadata file, which a stage-2 run
    that reads a cache refuses)."""
    data = ["--dataset_metadata_path", "m.csv"] if metadata else ["--dataset_base_path", "cache"]
    namespace = build_parser(video=video).parse_args(["--model_id_with_origin_paths", "Qwen/Qwen-Image:transformer/*",
                                                      "--lora_base_model", "dit", *data, *argv])
    return RunConfig.from_namespace(namespace, runnable=False)


def test_guidance_and_the_seed_matter_to_distillation_only():
    pipe = QwenImagePipeline()
    sft = inputs_that_matter(pipe.units, FlowMatchSFTLoss.required_keys(pipe))
    distill = inputs_that_matter(pipe.units, DirectDistillLoss.required_keys(pipe))
    assert {"input_image", "edit_image", "layer_input_image", "context_image", "height", "width", "max_sequence_length",
            "eligen_entity_prompts", "eligen_entity_masks", "eligen_enable_on_negative", "blockwise_controlnet_inputs",
            "blockwise_controlnet_image", "blockwise_controlnet_inpaint_mask"} == sft
    # Layered's layer count shapes the seeded noise a distilled sampler starts from
    assert distill - sft == {*DISTILL, "layer_num"}
    assert "edit_image" not in inputs_that_matter(WanVideoPipeline().units,
                                                  FlowMatchSFTLoss.required_keys(WanVideoPipeline()))


@pytest.mark.parametrize(("pipeline_class", "argv", "unread"), [
    (QwenImagePipeline, ["--extra_inputs", ",".join(DISTILL)], DISTILL),
    (QwenImagePipeline, ["--extra_inputs", "edit_image,edit_imagee"], ["edit_imagee"]),
    (WanVideoPipeline, ["--extra_inputs", "edit_image"], ["edit_image"]),  # Wan has no edit images
])
def test_extra_inputs_nothing_reads_are_refused(pipeline_class, argv, unread):
    with pytest.raises(FlagError) as error:
        check_inputs_used(flags(*argv, video=pipeline_class is WanVideoPipeline), pipeline_class)
    assert f"{unread} would be passed to {pipeline_class.__name__} with --task sft" in str(error.value)
    assert "neither its units nor FlowMatchSFTLoss read them" in str(error.value)


def test_frame_rate_is_refused_where_nothing_reads_it_and_warned_about_in_stage_two(caplog):
    from diffsynth.pipelines.ltx2 import LTX2AudioVideoPipeline

    check_inputs_used(flags("--frame_rate", "30", video=True), LTX2AudioVideoPipeline)
    with pytest.raises(FlagError) as error:
        check_inputs_used(flags("--frame_rate", "30", video=True), WanVideoPipeline)
    assert error.value.problems == [
        "--frame_rate 30.0 has no effect on WanVideoPipeline: neither its units nor FlowMatchSFTLoss read a frame_rate "
        "(it reads the first --num_frames frames of each clip as they are); drop --frame_rate"]
    with pytest.raises(FlagError) as error:  # a column every row must give leaves nothing to default
        check_inputs_used(flags("--frame_rate", "30", "--extra_inputs", "frame_rate", video=True),
                          LTX2AudioVideoPipeline)
    assert error.value.problems[0].startswith("--frame_rate 30.0 has no effect: --extra_inputs frame_rate makes every "
                                              "row give its own frame_rate; drop --frame_rate")
    with caplog.at_level(logging.WARNING):
        check_inputs_used(flags("--frame_rate", "30", "--task", "sft:train", video=True, metadata=False),
                          LTX2AudioVideoPipeline)
    assert "--frame_rate 30.0 has no effect on --task sft:train: stage 1 applied it" in caplog.text
    # A frame_rate column is read where a row has it: no advice to pass it with --extra_inputs, which the flag refuses.
    columns = {"video", "prompt", "frame_rate"}
    assert warn_about_unread_columns(flags("--frame_rate", "30", video=True), LTX2AudioVideoPipeline, columns) == []
    assert warn_about_unread_columns(flags(video=True), LTX2AudioVideoPipeline, columns) == []
    assert warn_about_unread_columns(flags(video=True), WanVideoPipeline, {"video", "prompt", "input_image"}) == [
        "input_image"]  # teeth: a column Wan could read and is not given


def test_inputs_the_task_reads_pass():
    check_inputs_used(flags("--extra_inputs", ",".join(DISTILL), "--task", "direct_distill"), QwenImagePipeline)
    check_inputs_used(flags("--extra_inputs", "edit_image"), QwenImagePipeline)
    check_inputs_used(flags("--extra_inputs", "input_image", video=True), WanVideoPipeline)


def test_an_unread_extra_input_stops_the_trainer_before_any_model_loads(dataset, tmp_path, base, monkeypatch,
                                                                        fresh_accelerate_state):
    from diffsynth.core.loader import loading

    monkeypatch.setattr(loading, "load_model_from_files", lambda *a, **k: pytest.fail("weights were loaded"))
    with pytest.raises(FlagError, match=r"\['cfg_scale'\] would be passed to QwenImagePipeline"):
        main(QwenImagePipeline, [*raw(dataset), *COMMON, "--output_path", str(tmp_path / "out"), "--extra_inputs",
                                 "cfg_scale"])
    assert not (tmp_path / "out").exists()


def test_metadata_columns_the_task_could_read_but_does_not_are_named(caplog):
    columns = {"image", "prompt", *DISTILL, "notes"}
    with caplog.at_level(logging.WARNING):
        assert warn_about_unread_columns(flags("--task", "direct_distill"), QwenImagePipeline, columns) == \
            sorted(DISTILL)
    assert "--extra_inputs cfg_scale,num_inference_steps,rand_device,seed" in caplog.text
    assert warn_about_unread_columns(flags(), QwenImagePipeline, columns) == []  # SFT reads none of them


@pytest.mark.parametrize(("argv", "fragment"), [
    (["--task", "direct_distill", "--max_timestep_boundary", "0.5"], "distillation runs the whole sampler"),
    (["--lora_base_model", "", "--trainable_models", "dit", "--lora_alpha", "8"],
     "--lora_alpha 8.0 has no effect without --lora_base_model"),
    (["--task", "sft:data_process", "--max_train_steps", "10"],
     "--max_train_steps 10 has no effect on --task sft:data_process, which trains nothing"),
    (["--task", "sft:data_process", "--lora_checkpoint", "a.safetensors"], "pass it to the sft:train run"),
])
def test_flags_without_effect_are_refused(argv, fragment):
    problems = flag_effect_problems(flags(*argv))
    assert len(problems) == 1 and fragment in problems[0]


def test_flags_the_reference_repeats_in_stage_two_only_warn(caplog):
    with caplog.at_level(logging.WARNING):
        assert flag_effect_problems(flags("--task", "sft:train", "--height", "480", "--width", "832",
                                                metadata=False)) == []
    assert "--height 480 has no effect on --task sft:train" in caplog.text
