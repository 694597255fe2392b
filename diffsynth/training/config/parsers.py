"""The trainer's command line: one argparse group per concern, and the cross-flag checks.

Flag names and defaults follow the reference DiffSynth-Studio trainer, so its example commands run unchanged (its
flags this trainer does not support are accepted and refused by name: ``reference_flags``). Flags
beyond the reference (seeding, schedulers, clipping, mixed precision, resuming, a step budget) default to doing
nothing, so a reference command trains exactly as it did there. Two safety nets are on by default and change no
healthy run's weights: timed training-state checkpoints (``--checkpoint_every_minutes``) and the stop after
consecutive non-finite steps (``--max_nonfinite_steps``).

Only checks that need nothing but the flags live here. Whether model files exist, and whether a LoRA target matches
a module, is the loader's and the training module's business: they know the files and the model. The docs' flag
tables are rendered from these parsers by ``flag_docs``.
"""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Sequence
from pathlib import Path

from ...core.data.bad_samples import ON_BAD_SAMPLE_CHOICES
from ..errors import TASKS, FlagError, split_csv, task_stage
from ..loop.validation_prompts import add_validation_config, validation_problems
from ..objective.batches import add_batch_config, batch_problems
from ..objective.timestep_sampling import add_timestep_sampling_config, timestep_sampling_problems
from ..outputs.initial_weights import split_resume_flag
from ..placement.config import PlacementConfig, PlacementError
from ..placement.shared_host_weights import add_shared_host_weights_config
from .reference_flags import add_unsupported_config, unsupported_flag_problems

logger = logging.getLogger(__name__)

LR_SCHEDULERS = ("constant", "linear", "cosine", "constant_with_warmup")
MIXED_PRECISIONS = ("no", "fp16", "bf16")
TORCH_DTYPES = ("bfloat16", "float16", "float32")
# VAE downsampling (8) times the transformer's 2x2 patching, for both Qwen-Image and Wan.
SIZE_MULTIPLE = 16
MIN_PIXELS = 256


def add_dataset_config(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the dataset flags: where the samples are, how often they repeat, how many loader workers read them."""
    group = parser.add_argument_group("Dataset")
    group.add_argument("--dataset_base_path", type=str, default="",
                       help="Folder the metadata's file paths are relative to; for a *:train task, the stage-1 "
                            "cache folder (the --output_path of the *:data_process run).")
    group.add_argument("--dataset_metadata_path", type=str, default=None,
                       help="Metadata file (.csv, .json or .jsonl) listing the samples and their prompts.")
    group.add_argument("--dataset_repeat", type=int, default=1,
                       help="Times each epoch walks the dataset; use 1 for a *:data_process run.")
    group.add_argument("--dataset_num_workers", type=int, default=0,
                       help="DataLoader worker processes; 0 reads in the training process.")
    group.add_argument("--data_file_keys", type=str, default="image,video",
                       help="Comma list of metadata columns that hold file paths to load.")
    group.add_argument("--on_bad_sample", type=str, default="stop", choices=ON_BAD_SAMPLE_CHOICES,
                       help="A sample whose file fails to decode (checked at start-up for datasets up to a "
                            "gigapixel, else when first read): stop names its row and file and ends the run; skip "
                            "warns, counts it and trains (or caches) without it.")
    group.add_argument("--allow_partial_cache", action="store_true",
                       help="For a *:train task: train on the samples a stage-1 cache holds even when some are "
                            "missing (an interrupted stage 1), instead of refusing.")
    return parser


def _add_size_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--height", type=int, default=None,
                       help="Fixed sample height in pixels (a multiple of 16); unset resizes each sample to fit "
                            "--max_pixels, keeping its aspect ratio.")
    group.add_argument("--width", type=int, default=None,
                       help="Fixed sample width in pixels (a multiple of 16); give it together with --height.")
    group.add_argument("--max_pixels", type=int, default=1024 * 1024,
                       help="Pixel budget per frame when --height/--width are unset; larger samples are scaled down.")


def add_image_size_config(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the image size flags: a fixed height and width, or a pixel budget."""
    _add_size_flags(parser.add_argument_group("Image size"))
    return parser


def add_video_size_config(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the video size flags: the image size flags plus the frame count."""
    group = parser.add_argument_group("Video size")
    _add_size_flags(group)
    group.add_argument("--num_frames", type=int, default=81,
                       help="Frames per video sample; 4k+1 (e.g. 49, 81), as the video VAE compresses time by 4.")
    group.add_argument("--allow_shorter_videos", action="store_true",
                       help="Trim clips shorter than --num_frames to their largest 4k+1 frame count instead of "
                            "refusing them (samples then differ in length).")
    return parser


def add_model_config(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the flags that name the model files and where they are built."""
    group = parser.add_argument_group("Model")
    group.add_argument("--model_paths", type=str, default=None,
                       help='JSON list of local model files, an entry per model; a list entry holds the shards of '
                            'one model, e.g. \'["vae.safetensors", ["dit-1.safetensors", "dit-2.safetensors"]]\'.')
    group.add_argument("--model_id_with_origin_paths", type=str, default=None,
                       help="Comma list of model_id:file_pattern entries, resolved under DIFFSYNTH_MODEL_BASE_PATH "
                            "and downloaded only when missing.")
    group.add_argument("--tokenizer_path", type=str, default=None,
                       help="Tokenizer folder; unset takes it from the model repository.")
    group.add_argument("--processor_path", type=str, default=None,
                       help="Qwen-Image-Edit: Qwen2.5-VL processor folder that reads the edit images; unset takes the "
                            "processor/ folder of the transformer's repository.")
    group.add_argument("--zero_cond_t", action="store_true",
                       help="Qwen-Image-Edit-2511: modulate the edit images' tokens as at timestep 0. The released "
                            "2511 transformer's config already turns it on; the flag turns it on for any other.")
    group.add_argument("--extra_inputs", type=str, default=None,
                       help="Comma list of extra metadata columns passed to the pipeline (e.g. edit_image).")
    group.add_argument("--offload_models", type=str, default=None,
                       help="Entries of --model_id_with_origin_paths that this stage never computes with (split "
                            "training); they are built without weights, so they cost no memory or load time.")
    group.add_argument("--fp8_models", type=str, default=None,
                       help="Entries of --model_id_with_origin_paths whose frozen Linear and convolution weights are "
                            "stored in float8 (scaled per output row or channel, cast up to --torch_dtype for each "
                            "call, so nothing computes in fp8): half the memory and offload traffic of bf16, about "
                            "2.5%% weight error. Embeddings, norms and biases stay in --torch_dtype (small, or read "
                            "by index), as do layers the model class keeps in float32 (its code casts their inputs "
                            "to their dtype); a listed model with no Linear or convolution layer is only noted. A "
                            "LoRA on such a model trains in float32 as usual.")
    group.add_argument("--quant_options", type=str, default=None,
                       help="Quantize loaded models' frozen Linear weights: semicolon list of "
                            "<model>:<method>[/<excluded layers>], <model> copied from --model_id_with_origin_paths, "
                            "e.g. 'Qwen/Qwen-Image:transformer/diffusion_pytorch_model*.safetensors:bitsandbytes_nf4/"
                            "img_in,proj_out'. Method bitsandbytes_nf4 (pip install bitsandbytes): 4-bit NormalFloat "
                            "weights computed in --torch_dtype, about 0.56 bytes per weight and 9%% weight error; "
                            "excluded layers (matched by name or name end) stay in full precision. A LoRA on such a "
                            "model trains in float32. Not with --enable_model_cpu_offload or --blocks_to_swap.")
    group.add_argument("--torch_dtype", type=str, default="bfloat16", choices=TORCH_DTYPES,
                       help="dtype the models are loaded and computed in; LoRA weights always train in float32.")
    group.add_argument("--initialize_model_on_cpu", action="store_true",
                       help="Build the models on the CPU and move them later; slower start, lower peak VRAM.")
    return parser


def add_training_config(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the optimisation flags: task, learning rate and schedule, epochs, accumulation, precision, resuming."""
    group = parser.add_argument_group("Training")
    group.add_argument("--learning_rate", type=float, default=1e-4, help="Peak learning rate of the optimizer.")
    group.add_argument("--num_epochs", type=int, default=1, help="Epochs to train.")
    group.add_argument("--trainable_models", type=str, default=None,
                       help="Comma list of pipeline models trained in full (e.g. dit); unset trains only the LoRA.")
    group.add_argument("--find_unused_parameters", action="store_true",
                       help="Let DDP tolerate parameters that get no gradient; costs a graph walk per step.")
    group.add_argument("--weight_decay", type=float, default=0.01, help="Weight decay of the optimizer.")
    group.add_argument("--customized_optimizer", type=str, default=None,
                       help="Optimizer class by dotted path, e.g. torch.optim.Adam or bitsandbytes.optim.AdamW8bit "
                            "(pip install bitsandbytes), built with --learning_rate and --weight_decay; unset uses "
                            "torch.optim.AdamW (DeepSpeed's CPU Adam when ZeRO offloads the optimizer). Checked to "
                            "import before any model loads; a resume needs the optimizer its checkpoint was made "
                            "with.")
    group.add_argument("--task", type=str, default="sft", choices=TASKS,
                       help="Training task; a :data_process / :train suffix runs one stage of split training.")
    group.add_argument("--gradient_accumulation_steps", type=int, default=1,
                       help="Batches per optimizer step; more steps give a larger effective batch at no VRAM cost.")
    group.add_argument("--seed", type=int, default=None,
                       help="Seed of the random number generators; unset leaves them unseeded, as the reference "
                            "trainer does. Set it for a reproducible run.")
    group.add_argument("--lr_scheduler", type=str, default="constant", choices=LR_SCHEDULERS,
                       help="Learning-rate schedule over the optimizer steps.")
    group.add_argument("--lr_warmup_steps", type=int, default=0,
                       help="Optimizer steps of linear warm-up; needs a schedule other than constant.")
    group.add_argument("--max_grad_norm", type=float, default=None,
                       help="Clip the gradient norm to this value; unset clips nothing, as the reference trainer.")
    group.add_argument("--mixed_precision", type=str, default="no", choices=MIXED_PRECISIONS,
                       help="Mixed precision passed to accelerate's Accelerator; no trains in the weights' dtype.")
    group.add_argument("--resume_from_checkpoint", type=str, default=None,
                       help='A training-state folder, or "latest" for the newest one in --output_path: resumes the '
                            "whole run (weights, optimizer, schedule, data position). A .safetensors weights file "
                            "(the reference's meaning, e.g. a full fine-tune's epoch-4.safetensors): starts from "
                            "those weights, loaded into the model --remove_prefix_in_ckpt names (pipe.dit.: the "
                            "transformer), with a fresh optimizer.")
    group.add_argument("--min_timestep_boundary", type=float, default=0.0,
                       help="Lower end of the drawn training timesteps, as a fraction of the noisiest-first grid.")
    group.add_argument("--max_timestep_boundary", type=float, default=1.0,
                       help="Upper end of the drawn training timesteps; e.g. 0.5 trains on the noisier half only.")
    group.add_argument("--max_train_steps", type=int, default=None,
                       help="Stop after this many optimizer steps, even within an epoch; unset runs all epochs.")
    group.add_argument("--max_nonfinite_steps", type=int, default=3,
                       help="A step whose loss or gradient norm is NaN or inf is skipped (no update) and counted; "
                            "after this many such steps in a row training stops with exit code 3, naming the "
                            "samples and the last checkpoint.")
    return parser


def add_output_config(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the flags that say where checkpoints go, how they are named and how often they are written."""
    group = parser.add_argument_group("Output")
    group.add_argument("--output_path", type=str, default="./output",
                       help="Folder for checkpoints, LoRA files, logs and training_args.json (for a *:data_process "
                            "task, the stage-1 cache). One run at a time: a lock file refuses a second run while one "
                            "is writing there. Not the model folder (./models).")
    group.add_argument("--overwrite_output", action="store_true",
                       help="Start afresh in an --output_path that holds an earlier run's outputs: removes the files "
                            "the trainer writes there (LoRA files and their .diffusers twins, checkpoints/, samples/, "
                            "logs/metrics.csv, logs/loss.png, logs/tensorboard/, training_args.json; for *:data_process the cached samples and "
                            "cache_info.json) before starting; other files are kept. Without it such a folder is "
                            "refused, unless --resume_from_checkpoint continues the run.")
    group.add_argument("--remove_prefix_in_ckpt", type=str, default="pipe.dit.",
                       help="Prefix removed from the weight names saved, so files load into the bare model.")
    group.add_argument("--save_steps", type=int, default=None,
                       help="Also write a LoRA file and a training-state checkpoint every N optimizer steps; unset "
                            "writes them at the end of each epoch.")
    group.add_argument("--checkpoint_every_minutes", type=float, default=30.0,
                       help="Also write a training-state checkpoint (for --resume_from_checkpoint, not a LoRA file) "
                            "once this many minutes have passed since the last one, so a crash or preemption "
                            "loses at most that much work; 0 turns it off.")
    group.add_argument("--checkpoints_total_limit", type=int, default=2,
                       help="Training-state checkpoints (for --resume_from_checkpoint) kept in "
                            "output_path/checkpoints; older ones are deleted. LoRA files are always kept.")
    return parser


def add_lora_config(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the LoRA flags: which model and layers get adapters, their rank and scale, a LoRA to start from."""
    group = parser.add_argument_group("LoRA")
    group.add_argument("--lora_base_model", type=str, default=None,
                       help="Pipeline model that gets the LoRA (e.g. dit); unset trains no LoRA.")
    group.add_argument("--lora_target_modules", type=str, default="q,k,v,o,ffn.0,ffn.2",
                       help="Comma list of layer names (suffixes) in --lora_base_model that get adapters. The default is "
                            "the reference's; diffusers models name their layers e.g. to_q,to_k,to_v,to_out.0.")
    group.add_argument("--lora_rank", type=int, default=32,
                       help="LoRA rank; higher learns more, with more trainable weights and optimizer memory.")
    group.add_argument("--lora_alpha", type=float, default=None,
                       help="LoRA scale numerator (the update is scaled by alpha / rank); unset equals the rank.")
    group.add_argument("--lora_checkpoint", type=str, default=None,
                       help="LoRA .safetensors file whose weights start the training.")
    group.add_argument("--preset_lora_path", type=str, default=None,
                       help="Differential LoRA: a LoRA .safetensors file (any layout; docs/en/Using_LoRA.md) merged "
                            "into the frozen weights of --preset_lora_model before training, so the new LoRA learns "
                            "the difference from it. Use the new LoRA on the base with the preset merged (or both "
                            "LoRAs loaded).")
    group.add_argument("--preset_lora_model", type=str, default=None,
                       help="Pipeline model the --preset_lora_path LoRA is merged into (e.g. dit).")
    return parser


def add_gradient_config(parser: argparse.ArgumentParser, always_on: bool = False) -> argparse.ArgumentParser:
    """Adds the activation-memory flags: gradient checkpointing, optionally with its activations on the CPU.

    With ``always_on`` (the video trainer) checkpointing is on whatever the flag says, as the reference's Wan trainer
    forces it: a video's activations do not fit otherwise.
    """
    group = parser.add_argument_group("Gradient checkpointing")
    # musubi-tuner spells it --gradient_checkpointing; both names set the same flag.
    names = ("--use_gradient_checkpointing", "--gradient_checkpointing")
    if always_on:
        group.add_argument(*names, action="store_true", default=True,
                           help="Recompute activations in the backward pass. Always on for video (Wan) training, as "
                                "the reference's Wan trainer forces it: a video's activations do not fit otherwise. "
                                "Also spelled --gradient_checkpointing.")
    else:
        group.add_argument(*names, action="store_true",
                           help="Recompute activations in the backward pass: much less VRAM, about a third slower. "
                                "Also spelled --gradient_checkpointing (musubi-tuner).")
    group.add_argument("--use_gradient_checkpointing_offload", action="store_true",
                       help="Also keep the checkpointed activations in CPU memory; implies "
                            "--use_gradient_checkpointing. Least VRAM, slower still.")
    return parser


def add_offload_training_config(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the offload-training flags: weights streamed from CPU memory layer by layer."""
    group = parser.add_argument_group("Offload training")
    group.add_argument("--enable_model_cpu_offload", action="store_true",
                       help="Keep the weights on the CPU and move each layer to the GPU only while it runs; "
                            "2-10x slower, weight VRAM of one layer.")
    group.add_argument("--enable_optimizer_cpu_offload", action="store_true",
                       help="With --enable_model_cpu_offload, also keep trainable weights, gradients and optimizer "
                            "state on the CPU; for full fine-tunes that do not fit otherwise.")
    group.add_argument("--cpu_offload_split_threshold", type=float, default=None,
                       help="Experimental (MB): modules larger than this are offloaded piece by piece rather than "
                            "as a whole; unset offloads leaf layers.")
    group.add_argument("--offload_prefetch_depth", type=int, default=None,
                       help="Units whose weights are copied ahead of use on a side stream while the current one "
                            "computes; unset: 1 on CUDA, 0 elsewhere. Each extra unit costs its weights in memory.")
    return parser


def add_block_swap_config(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the block swap flags (the denoising transformer's blocks kept in host memory; see docs Block_Swap)."""
    group = parser.add_argument_group("Block swap")
    group.add_argument("--blocks_to_swap", type=int, default=0,
                       help="Blocks of the transformer kept in host memory and moved to the GPU only while they "
                            "compute; 0 turns block swap off.")
    group.add_argument("--block_swap_h2d_only", action="store_true",
                       help="Stream those blocks' frozen weights into a small ring of GPU slots, host-to-device only "
                            "(LoRA training; needs --use_gradient_checkpointing).")
    group.add_argument("--block_swap_ring_size", type=int, default=2,
                       help="GPU slots for streamed blocks with --block_swap_h2d_only; more slots, more overlap.")
    group.add_argument("--use_pinned_memory_for_block_swap", action="store_true",
                       help="Keep swapped weights in pinned host memory: faster copies, RAM locked for the run.")
    return parser


def add_planner_config(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the memory planner flags: budgets the placement is chosen to fit before anything loads (docs Low_VRAM)."""
    group = parser.add_argument_group("Memory planner")
    group.add_argument("--vram_budget", type=str, default=None,
                       help="GPU memory in GB the run may use, or auto (free memory less 0.5 GB): the planner predicts "
                            "every placement before loading and picks the fastest that fits. Offload or block swap "
                            "flags given explicitly win; then it only predicts and warns.")
    group.add_argument("--ram_budget", type=str, default=None,
                       help="Host memory in GB the run may use, or auto (available memory less 2 GB); planned "
                            "together with --vram_budget.")
    return parser


def add_logging_config(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the metric-logging flags: CSV, TensorBoard and Weights & Biases."""
    group = parser.add_argument_group("Logging")
    group.add_argument("--enable_tensorboard_log", action="store_true",
                       help="Write TensorBoard events under <output_path>/logs (needs: pip install tensorboard).")
    group.add_argument("--enable_csv_log", action="store_true",
                       help="Append step, loss, learning rate and the running count of skipped non-finite steps "
                            "to <output_path>/logs/metrics.csv.")
    group.add_argument("--enable_wandb_log", action="store_true",
                       help="Log metrics to Weights & Biases (needs: pip install wandb).")
    group.add_argument("--wandb_project", type=str, default="diffsynth", help="Weights & Biases project name.")
    return parser


def add_console_config(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the flags for what the run prints: progress lines, and tracebacks of the errors the user must fix."""
    group = parser.add_argument_group("Console")
    group.add_argument("--progress_interval_seconds", type=float, default=30.0,
                       help="When stderr is not a terminal (a log file, nohup, a scheduler, CI), progress is one "
                            "line (step, epoch, loss, speed, ETA, peak GPU memory) after the first step, then at "
                            "least this many seconds apart, instead of a tqdm bar; 0 writes a line every step.")
    group.add_argument("--debug", action="store_true",
                       help="Also print the traceback of errors the message says how to fix (flags, data, missing "
                            "model files, the output folder, non-finite values: exit codes 2 and 3); "
                            "DIFFSYNTH_DEBUG=1 does the same.")
    return parser


def build_parser(description: str = "Train a LoRA or fine-tune a diffusion model.",
                 video: bool = False) -> argparse.ArgumentParser:
    """Builds the full trainer parser; ``video`` swaps the image size group for the video one (adds --num_frames)."""
    parser = argparse.ArgumentParser(description=description)
    add_dataset_config(parser)
    (add_video_size_config if video else add_image_size_config)(parser)
    add_batch_config(parser)
    for add in (add_model_config, add_training_config, add_timestep_sampling_config, add_output_config,
                add_validation_config, add_lora_config):
        add(parser)
    add_gradient_config(parser, always_on=video)
    for add in (add_offload_training_config, add_block_swap_config, add_shared_host_weights_config,
                add_planner_config, add_logging_config, add_console_config, add_unsupported_config):
        add(parser)
    return parser


# (flag, bound, whether the bound itself is allowed, an example fix); unset optional flags are not checked.
_LOWER_BOUNDS = (
    ("learning_rate", 0, False, "--learning_rate 1e-4"),
    ("num_epochs", 1, True, "--num_epochs 1"),
    ("dataset_repeat", 1, True, "--dataset_repeat 1"),
    ("dataset_num_workers", 0, True, "--dataset_num_workers 0"),
    ("gradient_accumulation_steps", 1, True, "--gradient_accumulation_steps 1"),
    ("save_steps", 1, True, "--save_steps 500, or drop it to save once per epoch"),
    ("checkpoints_total_limit", 1, True, "--checkpoints_total_limit 2"),
    ("lr_warmup_steps", 0, True, "--lr_warmup_steps 0 for no warm-up"),
    ("max_train_steps", 1, True, "--max_train_steps 1000, or drop it to run all epochs"),
    ("max_grad_norm", 0, False, "--max_grad_norm 1.0, or drop it to clip nothing"),
    ("weight_decay", 0, True, "--weight_decay 0.01"),
    ("lora_rank", 1, True, "--lora_rank 32"),
    ("lora_alpha", 0, False, "--lora_alpha 32, or drop it to use the rank"),
    ("max_pixels", MIN_PIXELS, True, "--max_pixels 1048576 (1024x1024)"),
    ("max_nonfinite_steps", 1, True, "--max_nonfinite_steps 3"),
    ("checkpoint_every_minutes", 0, True, "--checkpoint_every_minutes 30, or 0 for no timed checkpoints"),
    ("progress_interval_seconds", 0, True, "--progress_interval_seconds 30, or 0 for a line every step"),
)
# Fixes for float flags that have no lower bound above.
_FLOAT_EXAMPLES = {
    "min_timestep_boundary": "--min_timestep_boundary 0",
    "max_timestep_boundary": "--max_timestep_boundary 1",
    "cpu_offload_split_threshold": "--cpu_offload_split_threshold 256",
}


def _finite_problems(args: argparse.Namespace) -> list[str]:
    """Every float flag, the model-specific ones included, must be a finite number: argparse's ``float`` takes
    ``nan`` and ``inf``, and an infinite learning rate or clipping norm trains NaN weights."""
    examples = {**{name: example for name, _, _, example in _LOWER_BOUNDS}, **_FLOAT_EXAMPLES}
    return [f"--{name} {value} must be a finite number (nan and inf are refused); pass e.g. "
            f"{examples.get(name, f'--{name} 1.0')}"
            for name, value in vars(args).items() if isinstance(value, float) and not math.isfinite(value)]


def _bound_problems(args: argparse.Namespace) -> list[str]:
    problems = []
    for name, bound, inclusive, example in _LOWER_BOUNDS:
        value = getattr(args, name, None)
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            continue  # unset, or reported by _finite_problems
        if value > bound or (inclusive and value == bound):
            continue
        relation = f"at least {bound}" if inclusive else f"greater than {bound}"
        problems.append(f"--{name} {value} must be {relation}; pass e.g. {example}")
    return problems


def _offload_problems(args: argparse.Namespace) -> list[str]:
    # The placement rules (offload, block swap, checkpointing) live with the configuration the runner receives.
    try:
        PlacementConfig.from_args(args)
    except PlacementError as error:
        return error.problems
    return []


def _size_problems(args: argparse.Namespace) -> list[str]:
    problems = []
    height, width = args.height, args.width
    if (height is None) != (width is None):
        given, missing = ("--height", "--width") if width is None else ("--width", "--height")
        problems.append(f"{given} {height if width is None else width} was given without {missing}; pass both for "
                        f"a fixed size, or neither to size samples by --max_pixels")
    for flag, value in (("--height", height), ("--width", width)):
        if value is not None and (value <= 0 or value % SIZE_MULTIPLE):
            nearest = max(SIZE_MULTIPLE, round(value / SIZE_MULTIPLE) * SIZE_MULTIPLE)
            problems.append(f"{flag} {value} must be a positive multiple of {SIZE_MULTIPLE} (the VAE and patch "
                            f"stride); pass e.g. {flag} {nearest}")
    frames = getattr(args, "num_frames", None)
    if frames is not None and (frames < 1 or frames % 4 != 1):
        suggestion = max(1, round((frames - 1) / 4) * 4 + 1)
        problems.append(f"--num_frames {frames} must be 4k+1 (the video VAE compresses time by 4); pass e.g. "
                        f"--num_frames {suggestion}")
    return problems


def _task_problems(args: argparse.Namespace) -> list[str]:
    if args.task not in TASKS:  # argparse rejects it already; this covers a Namespace built in code
        return [f"--task {args.task!r} is not a known task; choose one of {', '.join(TASKS)}"]
    problems = []
    family, stage = task_stage(args.task)
    if stage != "data_process" and not args.trainable_models and not args.lora_base_model:
        problems.append(f"--task {args.task} has nothing to train: neither --trainable_models nor --lora_base_model "
                        f"is set (--lora_target_modules {args.lora_target_modules!r} picks layers, not a model); "
                        f"add --lora_base_model dit for a LoRA, or --trainable_models dit for a full fine-tune")
    if stage == "train" and not args.dataset_base_path:
        problems.append(f"--task {args.task} reads the stage-1 cache, but --dataset_base_path is empty; pass the "
                        f"--output_path of the {family}:data_process run as --dataset_base_path")
    if stage == "train" and args.dataset_metadata_path:
        problems.append(f"--task {args.task} reads the stage-1 cache in --dataset_base_path, not a metadata file; "
                        f"drop --dataset_metadata_path {args.dataset_metadata_path!r} (or use --task {family} to "
                        f"train from the raw dataset)")
    if stage != "train" and not args.dataset_metadata_path:
        problems.append(f"--task {args.task} reads a dataset, but --dataset_metadata_path is unset; pass the "
                        f"metadata .csv / .json / .jsonl (columns such as image,prompt)")
    if stage != "train" and args.allow_partial_cache:
        problems.append(f"--allow_partial_cache applies to the stage-1 cache that --task {family}:train reads; drop "
                        f"it from --task {args.task}")
    if stage == "train" and args.on_bad_sample != "stop":
        problems.append(f"--on_bad_sample {args.on_bad_sample} has no effect on --task {args.task}, which reads the "
                        f"stage-1 cache; pass it to the {family}:data_process run, or drop it")
    if stage == "data_process" and args.enable_optimizer_cpu_offload:
        logger.warning("--enable_optimizer_cpu_offload is ignored by --task %s: stage 1 trains nothing, so there is "
                       "no optimizer to offload", args.task)
    return problems


def _quant_problems(args: argparse.Namespace) -> list[str]:
    if not args.quant_options:
        return []
    from ..placement.quant_options import quant_flag_problems

    return quant_flag_problems(args)


def _optimizer_problems(args: argparse.Namespace) -> list[str]:
    """The optimizer class must import now, not after the models loaded."""
    if not args.customized_optimizer:
        return []
    from ..loop.optimizer import resolve_optimizer_class

    try:
        resolve_optimizer_class(args.customized_optimizer)
    except ValueError as error:
        return [str(error)]
    if task_stage(args.task)[1] == "data_process":
        return [f"--customized_optimizer {args.customized_optimizer} has no effect on --task {args.task}, which "
                "trains nothing; pass it to the training stage"]
    return []


def _preset_lora_problems(args: argparse.Namespace) -> list[str]:
    """The preset LoRA's two flags go together; whether the file fits its model is checked against the model (a
    script's first command may write the file its second command merges)."""
    problems = []
    if bool(args.preset_lora_path) != bool(args.preset_lora_model):
        given, missing = (("--preset_lora_path", "--preset_lora_model") if args.preset_lora_path
                          else ("--preset_lora_model", "--preset_lora_path"))
        problems.append(f"{given} {args.preset_lora_path or args.preset_lora_model} needs {missing}: the preset LoRA "
                        "is merged into one model; pass both (e.g. --preset_lora_model dit), or neither")
    return problems


def _overwrite_problems(args: argparse.Namespace) -> list[str]:
    resume = args.resume_from_checkpoint
    if not (args.overwrite_output and resume):
        return []
    output = Path(args.output_path).resolve()
    if resume != "latest" and not Path(resume).resolve().is_relative_to(output):
        return []  # resuming from another folder's checkpoint into a cleaned one is fine
    return [f"--overwrite_output removes the checkpoints in --output_path {args.output_path}, which "
            f"--resume_from_checkpoint {resume} would resume from; drop --overwrite_output to continue that run, or "
            "drop --resume_from_checkpoint to start afresh"]


def validate_args(args: argparse.Namespace) -> argparse.Namespace:
    """Checks the flags against each other, collecting every conflict before raising.

    ``--use_gradient_checkpointing_offload`` implies ``--use_gradient_checkpointing`` (as in the reference trainer,
    where offloading the checkpointed activations is a kind of checkpointing); ``args`` is updated to say so.

    A ``--resume_from_checkpoint`` that names a weights file moves to ``args.initial_weights`` (``initial_weights``);
    ``args.resume_from_checkpoint`` then keeps only training-state checkpoints.

    Returns:
        ``args`` (the parsed flags of :func:`build_parser`), with implied flags set.

    Raises:
        FlagError: Some flags conflict; its message has one line per conflict, naming flag, value and fix.
    """
    problems = split_resume_flag(args)
    problems += (_finite_problems(args) + _bound_problems(args) + _offload_problems(args) + _size_problems(args)
                 + _task_problems(args) + _preset_lora_problems(args) + _optimizer_problems(args)
                 + _quant_problems(args) + unsupported_flag_problems(args) + timestep_sampling_problems(args)
                 + batch_problems(args) + validation_problems(args))
    if not args.model_paths and not args.model_id_with_origin_paths:
        problems.append("no model given: pass --model_id_with_origin_paths (e.g. "
                        "'Qwen/Qwen-Image:transformer/diffusion_pytorch_model*.safetensors') or --model_paths")
    if Path(args.output_path).is_file():
        problems.append(f"--output_path {args.output_path!r} is a file, but checkpoints go into a folder; pass a "
                        f"folder path (it is created if missing)")
    problems += _overwrite_problems(args)
    boundaries = (args.min_timestep_boundary, args.max_timestep_boundary)
    if all(map(math.isfinite, boundaries)) and not 0.0 <= boundaries[0] < boundaries[1] <= 1.0:
        problems.append(f"--min_timestep_boundary {args.min_timestep_boundary} and --max_timestep_boundary "
                        f"{args.max_timestep_boundary} must satisfy 0 <= min < max <= 1; e.g. --min_timestep_boundary "
                        "0 --max_timestep_boundary 1")
    if args.lr_warmup_steps > 0 and args.lr_scheduler == "constant":
        problems.append(f"--lr_warmup_steps {args.lr_warmup_steps} has no effect with --lr_scheduler constant; pass "
                        f"--lr_scheduler constant_with_warmup (or linear, cosine), or drop --lr_warmup_steps")
    if problems:
        raise FlagError(problems)
    if args.use_gradient_checkpointing_offload and not args.use_gradient_checkpointing:
        logger.info("--use_gradient_checkpointing_offload implies --use_gradient_checkpointing; enabling it")
        args.use_gradient_checkpointing = True
    return args


def parse_args(argv: Sequence[str] | None = None, video: bool = False,
               parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """Parses and validates the trainer flags; on a conflict prints usage and every problem, then exits (status 2).

    Args:
        argv: The arguments without the program name; None reads ``sys.argv``.
        video: Build the video parser (adds ``--num_frames``); ignored when ``parser`` is given.
        parser: A parser from :func:`build_parser`, possibly with extra model-specific flags.

    Returns:
        The validated flags.
    """
    parser = parser or build_parser(video=video)
    args = parser.parse_args(argv)
    try:
        return validate_args(args)
    except FlagError as error:
        parser.error("\n  " + "\n  ".join(error.problems))
