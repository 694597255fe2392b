"""The samples-while-training section: prompts rendered with the LoRA as it trains (docs Samples)."""

from __future__ import annotations

import argparse
import dataclasses
import math

from .section import Section


@dataclasses.dataclass(frozen=True)
class ValidationSection(Section):
    """The ``--validation_*`` flags; the prompts (a prompt, or a prompt file) are read and checked against the sizes
    training computes by ``RunConfig`` (``loop.validation_prompts.ValidationConfig``)."""

    validation_prompts: str | None = None
    validation_steps: int | None = None
    validation_epochs: int | None = None
    validation_num_inference_steps: int = 20
    validation_cfg_scale: float | None = None
    validation_seed: int = 0

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, video: bool = False) -> None:
        """Adds the Samples while training group."""
        group = parser.add_argument_group("Samples while training")
        group.add_argument("--validation_prompts", type=str, default=None,
                           help="Prompts rendered with the LoRA as it trains, by the main process, into "
                                "output_path/samples/step-N/: one prompt in quotes ('a dog on a beach'), a .txt "
                                "file (one prompt per line) or a .json list of prompts or objects with prompt, "
                                "negative_prompt, height, width, num_frames, fps, seed, edit_image, input_image, "
                                "end_image, reference_image, control_video, camera_control_direction, "
                                "camera_control_speed, vace_video, vace_video_mask, vace_reference_image, "
                                "animate_pose_video, animate_face_video, animate_inpaint_video, "
                                "animate_mask_video, animate2_reference_image, animate2_reference_video, "
                                "animate2_prompt_ref, eligen_entity_prompts, eligen_entity_masks. A value "
                                "that names no file is the prompt, unless it looks like a path (a "
                                ".txt / .json / .csv suffix, or one word with a /): then it is an error. Checked "
                                "before the models load.")
        group.add_argument("--validation_steps", type=int, default=None,
                           help="Render the prompts every N optimizer steps.")
        group.add_argument("--validation_epochs", type=int, default=None,
                           help="Render the prompts at the end of every N epochs.")
        group.add_argument("--validation_num_inference_steps", type=int, default=20,
                           help="Denoising steps of each sample.")
        group.add_argument("--validation_cfg_scale", type=float, default=None,
                           help="Classifier-free guidance of the samples; unset: the pipeline's (Qwen-Image 4, Wan 5).")
        group.add_argument("--validation_seed", type=int, default=0,
                           help="Noise seed of the prompts that give none; the same seed renders comparable samples.")

    def problems(self) -> list[str]:
        problems = super().problems()
        cfg_scale = self.validation_cfg_scale
        given = [flag for flag, value in (("--validation_steps", self.validation_steps),
                                          ("--validation_epochs", self.validation_epochs),
                                          ("--validation_cfg_scale", cfg_scale)) if value is not None]
        if self.validation_prompts is None and (cfg_scale is None or math.isfinite(cfg_scale)):
            problems += [f"{flag} has no effect without --validation_prompts; add the prompts (a prompt in quotes, or "
                         f"a prompt file), or drop {flag}" for flag in given]
        return problems
