"""The LoRA section: which model and layers get adapters, their rank and scale, and the LoRAs a run starts from."""

from __future__ import annotations

import argparse
import dataclasses

from .errors import split_csv
from .section import Section

LORA_TYPES = ("lora", "loha", "lokr")


@dataclasses.dataclass(frozen=True)
class LoraSection(Section):
    """The LoRA flags; ``lora_base_model`` unset trains no LoRA, ``lora_target_modules`` unset takes the model's
    defaults (:meth:`with_default_targets`)."""

    lora_base_model: str | None = None
    lora_target_modules: str | None = None
    lora_rank: int = 32
    lora_alpha: float | None = None
    lora_checkpoint: str | None = None
    preset_lora_path: str | None = None
    preset_lora_model: str | None = None
    align_to_opensource_format: bool = False
    lora_type: str = "lora"
    use_dora: bool = False
    lokr_factor: int = -1

    LOWER_BOUNDS = (
        ("lora_rank", 1, True, "--lora_rank 32"),
        ("lora_alpha", 0, False, "--lora_alpha 32, or drop it to use the rank"),
    )

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, video: bool = False) -> None:
        """Adds the LoRA group."""
        group = parser.add_argument_group("LoRA")
        group.add_argument("--lora_base_model", type=str, default=None,
                           help="Pipeline model that gets the LoRA (e.g. dit); unset trains no LoRA.")
        group.add_argument("--lora_target_modules", type=str, default=None,
                           help="Comma list of layer names (suffixes) in --lora_base_model that get adapters, e.g. "
                                "to_q,to_k,to_v,to_out.0. Unset: the model's own, the layers the reference's LoRA "
                                "scripts for it name (Qwen-Image: its attention, img_mlp / txt_mlp outputs and "
                                "modulations; Wan: q,k,v,o,ffn.0,ffn.2).")
        group.add_argument("--lora_rank", type=int, default=32,
                           help="LoRA rank; higher learns more, with more trainable weights and optimizer memory.")
        group.add_argument("--lora_alpha", type=float, default=None,
                           help="LoRA scale numerator (the update is scaled by alpha / rank); unset equals the rank.")
        group.add_argument("--lora_type", type=str, default="lora", choices=LORA_TYPES,
                           help="Adapter type: lora (B @ A), loha (LyCORIS's Hadamard product of two low-rank "
                                "products) or lokr (LyCORIS's Kronecker product), trained with peft and written in "
                                "the names ComfyUI and LyCORIS read (docs/en/LoRA_Types.md). --lora_rank and "
                                "--lora_alpha apply to each.")
        group.add_argument("--use_dora", action="store_true",
                           help="DoRA: a LoRA (--lora_type lora) that also learns each output row's magnitude; the "
                                "file holds it as dora_scale, which ComfyUI applies exactly.")
        group.add_argument("--lokr_factor", type=int, default=-1,
                           help="LoKr's Kronecker factor (peft's decompose_factor): each dimension splits into a "
                                "factor near this and the rest; -1 (default) splits it as evenly as it can.")
        group.add_argument("--lora_checkpoint", type=str, default=None,
                           help="LoRA .safetensors file whose weights start the training.")
        group.add_argument("--preset_lora_path", type=str, default=None,
                           help="Differential LoRA: a LoRA .safetensors file (any layout; docs/en/Using_LoRA.md) "
                                "merged into the frozen weights of --preset_lora_model before training, so the new "
                                "LoRA learns the difference from it. Use the new LoRA on the base with the preset "
                                "merged (or both LoRAs loaded).")
        group.add_argument("--preset_lora_model", type=str, default=None,
                           help="Pipeline model the --preset_lora_path LoRA is merged into (e.g. dit).")
        group.add_argument("--align_to_opensource_format", action="store_true",
                           help="Write the LoRA files in the kohya layout (lora_unet_<original layer name>, "
                                "lora_down / lora_up), for FLUX.1 with BFL's fused layer names "
                                "(lora_unet_double_blocks_0_img_attn_qkv), as the reference does; for Krea 2 in "
                                "diffusers' names under transformer., as the reference's Krea converter does. The "
                                "default layout loads in the same tools.")

    @property
    def targets(self) -> list[str]:
        """The layer names (suffixes) that get adapters (``--lora_target_modules``).

        Raises:
            ValueError: The flag is unset and the model's defaults were not filled in (:meth:`with_default_targets`).
        """
        if self.lora_target_modules is None:
            # Only the pipeline knows its layers; a run that read this unfilled would train or plan the wrong ones.
            raise ValueError("--lora_target_modules is unset and the model's defaults were not filled in; build the "
                             "run config with RunConfig.with_pipeline_defaults(pipeline_class)")
        return split_csv(self.lora_target_modules)

    def with_default_targets(self, default: str) -> LoraSection:
        """This section with an unset ``--lora_target_modules`` set to ``default``, the model's
        (``BasePipeline.default_lora_target_modules``); a given value is kept."""
        if self.lora_target_modules is not None:
            return self
        return dataclasses.replace(self, lora_target_modules=default)

    @property
    def preset(self) -> tuple[str | None, str] | None:
        """``(model, file)`` of the preset LoRA merged before training, or None."""
        return (self.preset_lora_model, self.preset_lora_path) if self.preset_lora_path else None

    def problems(self) -> list[str]:
        problems = super().problems()
        problems += self._type_problems()
        # The two preset flags go together; whether the file fits its model is checked against the model (a
        # script's first command may write the file its second command merges).
        if bool(self.preset_lora_path) != bool(self.preset_lora_model):
            given, missing = (("--preset_lora_path", "--preset_lora_model") if self.preset_lora_path
                              else ("--preset_lora_model", "--preset_lora_path"))
            problems.append(f"{given} {self.preset_lora_path or self.preset_lora_model} needs {missing}: the preset "
                            "LoRA is merged into one model; pass both (e.g. --preset_lora_model dit), or neither")
        return problems

    def _type_problems(self) -> list[str]:
        """``--lora_type``, ``--use_dora`` and ``--lokr_factor`` that contradict each other or do nothing."""
        problems = []
        if self.lora_type not in LORA_TYPES:
            problems.append(f"--lora_type {self.lora_type}: unknown adapter type; choose one of "
                            f"{', '.join(LORA_TYPES)}")
        if self.use_dora and self.lora_type != "lora":
            # peft's LoHaConfig and LoKrConfig have no DoRA (use_dora is LoraConfig's alone).
            problems.append(f"--use_dora with --lora_type {self.lora_type}: peft's DoRA exists for LoRA only; drop "
                            "--use_dora, or pass --lora_type lora")
        if self.lokr_factor != -1 and self.lora_type != "lokr":
            problems.append(f"--lokr_factor {self.lokr_factor} has no effect with --lora_type {self.lora_type}; drop "
                            "it, or pass --lora_type lokr")
        if self.lokr_factor == 0 or self.lokr_factor < -1:
            problems.append(f"--lokr_factor {self.lokr_factor} must be -1 (split evenly) or a positive factor, e.g. "
                            "--lokr_factor 8")
        if not self.lora_base_model:
            given = [flag for flag, value in (("--lora_type", self.lora_type != "lora"), ("--use_dora", self.use_dora))
                     if value]
            problems += [f"{flag} has no effect without --lora_base_model (no LoRA is trained); add --lora_base_model "
                         "dit, or drop it" for flag in given]
        return problems

    @property
    def adapter_type(self) -> str:
        """What the run trains and writes: ``lora``, ``lora+dora``, ``loha`` or ``lokr``."""
        return "lora+dora" if self.use_dora else self.lora_type
