"""What the family test kit (``tests/pipelines/test_family_kit.py``) needs of each registered family that its
``FamilySpec`` does not hold: which tiny repo it trains and loads, the diffusers pipeline that is its inference
reference, the call arguments of both, and the trainer flags of a small LoRA run.

One row per family name; a family without a row fails the kit's coverage test, so a new family adds its row here and
gets every shared check.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .tiny_flux import FLUX1_DEV_MODEL_ID, FLUX1_PATTERNS
from .tiny_flux2 import FLUX2_KLEIN_4B_MODEL_ID, FLUX2_KLEIN_BASE_4B_MODEL_ID, FLUX2_PATTERNS
from .tiny_ernie_image import ERNIE_IMAGE_MODEL_ID, ERNIE_IMAGE_PATTERNS
from .tiny_krea2 import KREA2_MODELS, KREA2_RAW_MODEL_ID, KREA2_TOKENIZER
from .tiny_ltx2 import LTX2_MODEL_ID, LTX2_PATTERNS
from .tiny_models import QWEN_IMAGE_MODEL_ID, QWEN_IMAGE_PATTERNS
from .tiny_stable_diffusion import SD15_MODEL_ID, SD15_PATTERNS
from .tiny_wan import WAN_MODEL_ID, WAN_PATTERNS
from .tiny_z_image import Z_IMAGE_PATTERNS, Z_IMAGE_TURBO_MODEL_ID


@dataclass(frozen=True)
class TinyFamily:
    """One family's tiny repo and how the kit runs it.

    Attributes:
        name: The family's registry name (its ``diffsynth/pipelines/<name>`` folder).
        model_id: The tiny repo diffusers' reference pipeline loads (``tiny_root / model_id``).
        models: ``{slot: "model_id:pattern"}``, the ``--model_id_with_origin_paths`` entries our pipeline loads; the
            slot is the pipeline attribute the model lands in.
        diffusers_pipeline: The diffusers pipeline class (a name in ``diffusers``) of the inference parity check.
        lora_targets: ``--lora_target_modules`` of the kit's LoRA runs.
        blocks_to_swap: ``--blocks_to_swap`` of the kit's block-swapped run (fewer than the tiny denoiser's blocks).
        call: Keyword arguments of our pipeline's call in the parity check (besides prompt, seed and output type).
        diffusers_call: Keyword arguments of diffusers' call (besides prompt, generator and output type).
        train_flags: Further trainer flags every run of the family needs (a tokenizer, a frame count).
        video: Whether it trains on a video dataset (``cli(..., video=True)``).
        output: The attribute of diffusers' output that holds the result (``images`` or ``frames``).
        diffusers_scheduler: Whether the parity check samples with diffusers' own scheduler (wrapped) in our pipeline,
            where ours is another one by design (Wan's UniPC).
        lora_tolerance: How far an offloaded or block-swapped run's LoRA may lie from the plain one.
        split_tolerance: How far the split run's LoRA may lie from the one-stage one.
        denoiser: The pipeline slot of the denoiser (``--lora_base_model``): ``dit``, or a UNet family's ``unet``.
        diffusers_denoiser: The attribute of diffusers' pipeline that holds it (``transformer`` or ``unet``).
    """

    name: str
    model_id: str
    models: Mapping[str, str]
    diffusers_pipeline: str
    lora_targets: str
    blocks_to_swap: int = 1
    call: Mapping[str, Any] = field(default_factory=dict)
    diffusers_call: Mapping[str, Any] = field(default_factory=dict)
    train_flags: tuple[str, ...] = ()
    video: bool = False
    output: str = "images"
    diffusers_scheduler: bool = False
    lora_tolerance: float = 1e-6
    split_tolerance: float = 1e-6
    denoiser: str = "dit"
    diffusers_denoiser: str = "transformer"

    @property
    def model_flag(self) -> str:
        """``--model_id_with_origin_paths`` of every model."""
        return ",".join(self.models.values())

    def encoders_flag(self) -> str:
        """``--model_id_with_origin_paths`` of every model but the denoiser (a split run's first stage)."""
        return ",".join(entry for slot, entry in self.models.items() if slot != self.denoiser)


def _entries(model_id: str, patterns: Mapping[str, str], slots: tuple[str, ...]) -> dict[str, str]:
    return {slot: f"{model_id}:{patterns[slot]}" for slot in slots}


IMAGE_SIZE = {"height": 48, "width": 80}
# LTX-2's clip on the tiny repo (3 x 16 x 16 video tokens and 5 audio tokens), and diffusers' guidance extras off: its
# STG, modality isolation and rescale, which the reference does not sample with.
LTX2_CLIP = {"height": 32, "width": 32, "num_frames": 5, "frame_rate": 25.0, "max_sequence_length": 16,
             "negative_prompt": "blurry"}
LTX2_PLAIN_GUIDANCE = {"guidance_scale": 3.0, "audio_guidance_scale": 3.0, "stg_scale": 0.0, "modality_scale": 1.0,
                       "guidance_rescale": 0.0, "audio_stg_scale": 0.0, "audio_modality_scale": 1.0,
                       "audio_guidance_rescale": 0.0, "spatio_temporal_guidance_blocks": None,
                       "use_cross_timestep": False}

TINY_FAMILIES: dict[str, TinyFamily] = {family.name: family for family in (
    TinyFamily(
        name="flux",
        model_id=FLUX1_DEV_MODEL_ID,
        # The released single files, as the reference's scripts name them; diffusers reads the repo's folders.
        models=_entries(FLUX1_DEV_MODEL_ID, FLUX1_PATTERNS, ("dit", "text_encoder", "text_encoder_2", "vae")),
        diffusers_pipeline="FluxPipeline",
        # The reference's own module names.
        lora_targets="a_to_qkv,b_to_qkv,ff_a.0,ff_a.2,ff_b.0,ff_b.2,a_to_out,b_to_out,proj_out,norm.linear,"
                     "norm1_a.linear,norm1_b.linear,to_qkv_mlp",
        blocks_to_swap=3,
        call={"cfg_scale": 1.0, "embedded_guidance": 3.5, **IMAGE_SIZE},
        diffusers_call={"true_cfg_scale": 1.0, "guidance_scale": 3.5, **IMAGE_SIZE},
    ),
    TinyFamily(
        name="flux2_klein",
        model_id=FLUX2_KLEIN_BASE_4B_MODEL_ID,
        # The base model reads the text encoder and VAE of its distilled sibling, as the reference's scripts do.
        models={**_entries(FLUX2_KLEIN_BASE_4B_MODEL_ID, FLUX2_PATTERNS, ("dit",)),
                **_entries(FLUX2_KLEIN_4B_MODEL_ID, FLUX2_PATTERNS, ("text_encoder", "vae"))},
        diffusers_pipeline="Flux2KleinPipeline",
        lora_targets="to_q,to_k,to_v,to_out.0,add_q_proj,to_add_out,linear_in,linear_out,to_qkv_mlp_proj",
        blocks_to_swap=6,
        call={"cfg_scale": 3.5, **IMAGE_SIZE},
        diffusers_call={"guidance_scale": 3.5, **IMAGE_SIZE},
        train_flags=("--tokenizer_path", f"{FLUX2_KLEIN_4B_MODEL_ID}:{FLUX2_PATTERNS['tokenizer']}"),
        # FLUX.2's shared modulation layers gather gradients from every block, in another order when offloaded.
        lora_tolerance=1e-5,
    ),
    TinyFamily(
        name="ernie_image",
        model_id=ERNIE_IMAGE_MODEL_ID,
        models=_entries(ERNIE_IMAGE_MODEL_ID, ERNIE_IMAGE_PATTERNS, ("dit", "text_encoder", "vae")),
        diffusers_pipeline="ErnieImagePipeline",
        lora_targets="to_q,to_k,to_v,to_out.0",
        call={"cfg_scale": 3.5, "negative_prompt": "blurry", **IMAGE_SIZE},
        diffusers_call={"guidance_scale": 3.5, "negative_prompt": "blurry", **IMAGE_SIZE},
    ),
    TinyFamily(
        name="krea2",
        model_id=KREA2_RAW_MODEL_ID,
        # The released single file and Qwen3-VL's own repo, as the reference's scripts name them; diffusers reads the
        # repo's folders.
        models=KREA2_MODELS[KREA2_RAW_MODEL_ID],
        diffusers_pipeline="Krea2Pipeline",
        # The reference's own module names.
        lora_targets="wq,wk,wv,gate,wo,up,down,first,tmlp.0,tmlp.2,projector,txtmlp.1,txtmlp.3,last.linear,tproj.1",
        call={"cfg_scale": 4.5, "negative_prompt": "blurry", **IMAGE_SIZE},
        diffusers_call={"guidance_scale": 3.5, "negative_prompt": "blurry", **IMAGE_SIZE},
        train_flags=("--tokenizer_path", KREA2_TOKENIZER),
    ),
    TinyFamily(
        name="ltx2",
        model_id=LTX2_MODEL_ID,
        models=_entries(LTX2_MODEL_ID, LTX2_PATTERNS,
                        ("dit", "text_encoder", "connectors", "vae", "audio_vae", "vocoder")),
        diffusers_pipeline="LTX2Pipeline",
        # The reference's LoRA scripts' targets: every attention of both streams.
        lora_targets="to_k,to_q,to_v,to_out.0",
        call={"cfg_scale": 3.0, **LTX2_CLIP},
        diffusers_call={**LTX2_PLAIN_GUIDANCE, **LTX2_CLIP},
        train_flags=("--num_frames", "5"),
        video=True,
        output="frames",
        # The split run's losses equal the one-stage run's to the last bit, yet its LoRA lies 1.2e-6 away after two
        # Adam steps (measured): last-bit differences of near-zero weight gradients, which Adam's normalisation
        # scales up.
        split_tolerance=1e-5,
    ),
    TinyFamily(
        name="qwen_image",
        model_id=QWEN_IMAGE_MODEL_ID,
        models=_entries(QWEN_IMAGE_MODEL_ID, QWEN_IMAGE_PATTERNS, ("dit", "text_encoder", "vae")),
        diffusers_pipeline="QwenImagePipeline",
        lora_targets="to_q,to_k,to_v,add_q_proj,to_out.0,img_mlp.net.2,txt_mod.1",
        call={"cfg_scale": 3.5, "negative_prompt": "blurry", **IMAGE_SIZE},
        diffusers_call={"true_cfg_scale": 3.5, "negative_prompt": "blurry", **IMAGE_SIZE},
    ),
    TinyFamily(
        name="stable_diffusion",
        model_id=SD15_MODEL_ID,
        models=_entries(SD15_MODEL_ID, SD15_PATTERNS, ("unet", "text_encoder", "vae")),
        diffusers_pipeline="StableDiffusionPipeline",
        # The Linear layers of the UNet's attention blocks. (Its resnets' time_emb_proj LoRAs, whose gradients are
        # near zero in places, come out of an offloaded run up to 2.4e-4 away after three Adam steps, measured, with
        # losses equal to 1e-7: Adam's normalisation scales last-bit differences up.)
        lora_targets="to_q,to_k,to_v,to_out.0,ff.net.2",
        call={"cfg_scale": 5.0, "negative_prompt": "blurry", "height": 32, "width": 32},
        diffusers_call={"guidance_scale": 5.0, "negative_prompt": "blurry", "height": 32, "width": 32},
        denoiser="unet",
        diffusers_denoiser="unet",
        # The attention LoRAs of an offloaded or split run lie up to about 5e-6 from the plain one (measured).
        lora_tolerance=1e-5,
        split_tolerance=1e-5,
    ),
    TinyFamily(
        name="wan_video",
        model_id=WAN_MODEL_ID,
        models=_entries(WAN_MODEL_ID, WAN_PATTERNS, ("dit", "text_encoder", "vae")),
        diffusers_pipeline="WanPipeline",
        lora_targets="q,k,v,o,ffn.0,ffn.2",
        call={"cfg_scale": 4.0, "negative_prompt": "static", "height": 32, "width": 48, "num_frames": 5},
        diffusers_call={"guidance_scale": 4.0, "negative_prompt": "static", "height": 32, "width": 48,
                        "num_frames": 5},
        train_flags=("--num_frames", "5"),
        video=True,
        output="frames",
        diffusers_scheduler=True,
    ),
    TinyFamily(
        name="z_image",
        model_id=Z_IMAGE_TURBO_MODEL_ID,
        models=_entries(Z_IMAGE_TURBO_MODEL_ID, Z_IMAGE_PATTERNS, ("dit", "text_encoder", "vae")),
        diffusers_pipeline="ZImagePipeline",
        lora_targets="to_q,to_k,to_v,to_out.0,w1,w2,w3",
        call={"cfg_scale": 1.0, **IMAGE_SIZE},
        diffusers_call={"guidance_scale": 0.0, **IMAGE_SIZE},
    ),
)}


def tiny_family(name: str) -> TinyFamily:
    """The row of family ``name``.

    Raises:
        KeyError: The table has none; the message names the table to add it to.
    """
    if name not in TINY_FAMILIES:
        raise KeyError(f"family {name!r} has no TinyFamily row in diffsynth/testing/families.py")
    return TINY_FAMILIES[name]
