"""The reference trainer's flags (DiffSynth-Studio's ``diffusion/parsers.py`` and its Qwen-Image and Wan
``train.py``), and what this trainer does with each.

Every one of them parses here, so a reference command never stops at "unrecognized arguments". Most work as there
(some with a note on a difference); the few this trainer does not support are accepted by the parser, in their own
group, and refused with a message naming the flag when given (``unsupported_flag_problems``). The docs' table of
reference flags is generated from this module and the parsers (``flag_docs.reference_flag_table``), so it cannot
drift.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from ...pipelines.registry import families, refused_model_ids

# Flag -> where the reference defines it.
REFERENCE_FLAGS: dict[str, str] = {
    **dict.fromkeys(["--dataset_base_path", "--dataset_metadata_path", "--dataset_repeat", "--dataset_num_workers",
                     "--data_file_keys", "--height", "--width", "--max_pixels", "--num_frames", "--model_paths",
                     "--model_id_with_origin_paths", "--extra_inputs", "--fp8_models", "--offload_models",
                     "--resume_from_checkpoint", "--quant_options", "--learning_rate", "--num_epochs",
                     "--trainable_models", "--find_unused_parameters", "--weight_decay", "--task",
                     "--customized_optimizer", "--output_path", "--remove_prefix_in_ckpt", "--save_steps",
                     "--lora_base_model", "--lora_target_modules", "--lora_rank", "--lora_checkpoint",
                     "--preset_lora_path", "--preset_lora_model", "--use_gradient_checkpointing",
                     "--use_gradient_checkpointing_offload", "--gradient_accumulation_steps",
                     "--template_model_id_or_path", "--enable_lora_hot_loading", "--enable_model_cpu_offload",
                     "--enable_optimizer_cpu_offload", "--cpu_offload_split_threshold", "--enable_tensorboard_log",
                     "--enable_swanlab_log", "--swanlab_project", "--enable_wandb_log", "--wandb_project",
                     "--enable_csv_log"], "diffusion/parsers.py"),
    **dict.fromkeys(["--dmd2_student_update_freq", "--dmd2_student_sample_steps", "--dmd2_student_sample_type",
                     "--dmd2_student_schedule", "--dmd2_student_t_list", "--dmd2_matching_t_min",
                     "--dmd2_matching_t_max", "--dmd2_matching_t_sampling", "--dmd2_matching_t_mean",
                     "--dmd2_matching_t_std", "--dmd2_gan_loss_weight", "--dmd2_gan_r1_reg_weight",
                     "--dmd2_gan_r1_reg_alpha", "--dmd2_fake_score_learning_rate",
                     "--dmd2_discriminator_learning_rate", "--dmd2_feature_indices", "--dmd2_teacher_cfg_scale",
                     "--dmd2_student_grad_clip_norm"], "diffusion/parsers.py (DMD2)"),
    # The flags only one family's train.py defines, where it is the reference's examples/<folder>/model_training.
    **{flag: f"{Path(spec.example_folder).parts[1]} train.py" for spec in families() for flag in spec.reference_flags},
}

_DMD2 = "DMD2 distillation (the reference's DMD2 trainer) is not supported here; --task direct_distill distills"
# Accepted so the reference's commands parse, refused when given: flag -> why, and what to do instead.
UNSUPPORTED: dict[str, str] = {
    "--template_model_id_or_path": "template models (the reference's image-to-LoRA template training) are not "
                                   "supported here",
    "--enable_lora_hot_loading": "LoRA hot-loading belongs to the reference's image-to-LoRA models, which are not "
                                 "supported here",
    "--enable_swanlab_log": "SwanLab logging is not supported here; use --enable_wandb_log, --enable_tensorboard_log "
                            "or --enable_csv_log",
    "--swanlab_project": "SwanLab logging is not supported here; use --enable_wandb_log with --wandb_project",
    "--audio_processor_path": "Wan2.2-S2V (speech-to-video), which needs the audio processor, is not supported here",
    "--framewise_decoding": "the WanToDance global model, which decodes frame by frame, is not supported here",
    **dict.fromkeys([flag for flag, where in REFERENCE_FLAGS.items() if flag.startswith("--dmd2_")], _DMD2),
}

# The unsupported flags that are switches (store_true there); the others take a value.
SWITCHES = frozenset({"--enable_lora_hot_loading", "--enable_swanlab_log", "--framewise_decoding"})

# Differences worth knowing for flags that work.
NOTES: dict[str, str] = {
    "--output_path": "default ./output: the reference's ./models is the model folder here",
    "--resume_from_checkpoint": "a weights file starts from those weights, as there; a training-state folder (or "
                                "latest) resumes the whole run, which the reference cannot",
    "--task": "sft and direct_distill, each also split into :data_process and :train",
    "--quant_options": "bitsandbytes_nf4 (needs bitsandbytes); other methods are refused with the list",
    "--fp8_models": "Linear and convolution weights in fp8, computed in --torch_dtype",
    "--use_gradient_checkpointing": "also spelled --gradient_checkpointing (musubi-tuner); always on for Wan, as "
                                    "there",
    "--cpu_offload_split_threshold": "takes fractional MB",
    "--wandb_project": "default diffsynth",
    "--find_unused_parameters": "only DDP reads it",
    "--num_frames": "the Wan trainer's, as there",
    "--frame_rate": "LTX-2 only, in the video trainer: the frame rate of rows without a frame_rate column; the "
                    "clips are read as they are, where the reference resamples them to it",
    "--extra_inputs": "a name nothing in the task reads is refused; metadata cells are typed as the pipeline reads "
                      "them (seed an int, cfg_scale a float)",
    "--preset_lora_path": "any LoRA layout the trainer reads",
    "--enable_npu_patch": "changes nothing: Ascend's fused operators apply only on an NPU, which this trainer does not "
                          "run on (the reference's flag does nothing on a GPU either)",
}


def add_unsupported_config(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the reference's flags this trainer does not support, each refused when given (see ``UNSUPPORTED``)."""
    group = parser.add_argument_group("Reference flags not supported here")
    for flag, reason in UNSUPPORTED.items():
        if flag in SWITCHES:
            group.add_argument(flag, action="store_true", help=f"Refused when given: {reason}.")
        else:
            group.add_argument(flag, type=str, default=None, help=f"Refused when given: {reason}.")
    return parser


def unsupported_flag_problems(flags: Mapping[str, Any]) -> list[str]:
    """One problem per unsupported reference flag the command gives (``flags``: flag name -> parsed value), naming it
    and saying why."""
    problems = []
    for flag, reason in UNSUPPORTED.items():
        value = flags.get(flag[2:])
        if value not in (None, False):
            shown = flag if value is True else f"{flag} {value}"
            problems.append(f"{shown}: {reason}; drop it")
    return problems


# Reference features this trainer does not run at all, named by a model id a command loads (repository id prefix, in
# --model_id_with_origin_paths or --template_model_id_or_path) or by its --task. Such a command is refused with that
# one reason before anything else is checked, downloaded or loaded.
UNSUPPORTED_MODELS: dict[str, str] = {
    "stepfun-ai/Step1X-Edit": "Step1X-Edit (Qwen2.5-VL with a FLUX.1-style editing DiT) is not supported here",
    "ByteDance/Video-As-Prompt-": "Video-As-Prompt is not supported here",
    "meituan-longcat/LongCat-Video": "LongCat-Video is not supported here",
}
"""The refused models of no family here; each family's own (``FamilySpec.refused_model_ids``) join them in
``unsupported_models``."""


def unsupported_models() -> dict[str, str]:
    """Every refused repository id prefix and why: the families' and ``UNSUPPORTED_MODELS``."""
    return {**refused_model_ids(), **UNSUPPORTED_MODELS}
# Reference features named only by the --extra_inputs they feed: EliGen's models are FLUX.1-dev's own, and the
# Qwen-Image Blockwise ControlNet commands may start a ControlNet from scratch, loading only Qwen-Image.
UNSUPPORTED_INPUTS: dict[str, str] = {
    "eligen_entity_masks": "EliGen (FLUX.1 entity-level regional prompts) is not supported here",
    "eligen_entity_prompts": "EliGen (FLUX.1 entity-level regional prompts) is not supported here",
    **dict.fromkeys(["blockwise_controlnet_image", "blockwise_controlnet_inpaint_mask"],
                    "the Qwen-Image Blockwise ControlNets are not supported here"),
}
UNSUPPORTED_TASKS: dict[str, str] = {
    "trajectory_imitation": "trajectory imitation (the reference's experimental Z-Image-Turbo distillation) is not "
                            "supported here; --task direct_distill distills a few-step sampler",
}


def unsupported_feature_problems(flags: Mapping[str, Any]) -> list[str]:
    """The unsupported reference feature the command names first (by a model it loads, an ``--extra_inputs`` name
    only that feature feeds, or its ``--task``), as a one-item list; empty when there is none (``flags``: flag
    name -> value)."""
    problems, refused = [], unsupported_models()
    for flag in ("model_id_with_origin_paths", "template_model_id_or_path"):
        for entry in str(flags.get(flag) or "").split(","):
            model_id = entry.split(":", 1)[0].strip()
            reason = next((why for prefix, why in refused.items() if model_id.startswith(prefix)), None)
            if model_id and reason is not None:
                problems.append(f"--{flag} loads {model_id}: {reason}")
    for name in str(flags.get("extra_inputs") or "").split(","):
        if name.strip() in UNSUPPORTED_INPUTS:
            problems.append(f"--extra_inputs {name.strip()}: {UNSUPPORTED_INPUTS[name.strip()]}")
    task = flags.get("task")
    if task in UNSUPPORTED_TASKS:
        problems.append(f"--task {task}: {UNSUPPORTED_TASKS[task]}")
    # One reason is enough: a feature that loads several unsupported models (Insert-Anything) says it once.
    return list(dict.fromkeys(problems))[:1]
