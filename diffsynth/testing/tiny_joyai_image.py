"""A tiny random-weight ``jd-opensource/JoyAI-Image-Edit`` repo: the released files the reference's scripts load, and
the diffusers folders diffusers' ``JoyImageEditPipeline`` reads, holding the same weights.

The released files: ``transformer/transformer.pth`` (JoyAI's own layout, ``original.py``), ``JoyAI-Image-Und/``
(a ``Qwen3VLForConditionalGeneration`` in ``model*.safetensors`` shards with its tokenizer and image preprocessing,
the Qwen3-VL of ``tiny_krea2``) and ``vae/Wan2.1_VAE.pth`` (the original Wan VAE of ``tiny_wan``). Beside them, for
diffusers: ``transformer/`` and ``vae/`` as diffusers folders, ``text_encoder/``, ``tokenizer/``, ``scheduler/``
(static shift 4, the reference's sampling shift), ``processor/`` and ``model_index.json``. Its ``processor`` is the
Qwen3-VL processor's image half: transformers builds the video half only with torchvision, and diffusers' text-to-image
path, which the parity check runs, does not use the processor.
"""

from __future__ import annotations

from pathlib import Path

from .tiny_common import SHARD_SIZE, model_index, prepare_repo, seeded, write_json

JOYAI_IMAGE_EDIT_MODEL_ID = "jd-opensource/JoyAI-Image-Edit"
# The reference's --model_id_with_origin_paths patterns, by pipeline slot.
JOYAI_IMAGE_PATTERNS = {
    "dit": "transformer/transformer.pth",
    "text_encoder": "JoyAI-Image-Und/model*.safetensors",
    "vae": "vae/Wan2.1_VAE.pth",
}
TRANSFORMER_CONFIG = {
    "patch_size": [1, 2, 2], "in_channels": 16, "hidden_size": 64, "num_attention_heads": 2, "text_dim": 32,
    "num_layers": 2, "rope_dim_list": [4, 14, 14],
}  # fmt: skip
SCHEDULER_CONFIG = {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000, "shift": 4.0,
                    "use_dynamic_shifting": False}
# Qwen3-VL's image preprocessing: 16-pixel patches merged 2x2, two frames per temporal patch.
QWEN3_VL_PREPROCESSOR_CONFIG = {
    "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "image_processor_type": "Qwen2VLImageProcessor",
    "merge_size": 2, "patch_size": 16, "temporal_patch_size": 2, "resample": 3, "rescale_factor": 1 / 255,
    "size": {"longest_edge": 16777216, "shortest_edge": 65536}, "processor_class": "Qwen3VLProcessor",
}  # fmt: skip
_COMPONENTS = {
    "scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler"),
    "text_encoder": ("transformers", "Qwen3VLForConditionalGeneration"),
    "tokenizer": ("transformers", "Qwen2Tokenizer"),
    "transformer": ("diffusers", "JoyImageEditTransformer3DModel"),
    "vae": ("diffusers", "AutoencoderKLWan"),
    # The Qwen3-VL processor's image half: transformers builds its video half only with torchvision.
    "processor": ("transformers", "Qwen2VLImageProcessor"),
}


def build_tiny_joyai_image_edit(root: Path, model_id: str = JOYAI_IMAGE_EDIT_MODEL_ID, seed: int = 0) -> Path:
    """Writes the tiny JoyAI-Image-Edit repo at ``root/<model_id>`` (and the tiny Qwen3-VL repo it copies the
    encoder from, when missing). Weights are float32."""
    from diffusers import JoyImageEditTransformer3DModel
    from transformers import Qwen3VLForConditionalGeneration

    from ..pipelines.joyai_image.original import original_key
    from .tiny_krea2 import _tokenizer, build_tiny_qwen3_vl
    from .tiny_wan import _save_pth, tiny_wan_vae, write_original_vae

    encoder_repo = build_tiny_qwen3_vl(root, seed)
    repo = prepare_repo(root, model_id)
    with seeded(seed + 11):
        transformer = JoyImageEditTransformer3DModel(**TRANSFORMER_CONFIG)
        # diffusers initialises the modulation tables at zero; random values make them count in the tests.
        for name, parameter in transformer.named_parameters():
            if "modulate_table" in name or "norm" in name:
                parameter.data.normal_(0.0, 0.1)
    transformer.save_pretrained(repo / "transformer", max_shard_size=SHARD_SIZE)
    _save_pth({original_key(key): tensor for key, tensor in transformer.state_dict().items()},
              repo / JOYAI_IMAGE_PATTERNS["dit"])
    encoder = Qwen3VLForConditionalGeneration.from_pretrained(str(encoder_repo))
    tokenizer = _tokenizer()
    for folder in ("JoyAI-Image-Und", "text_encoder"):
        encoder.save_pretrained(repo / folder, max_shard_size=SHARD_SIZE)
    for folder in ("JoyAI-Image-Und", "tokenizer"):
        tokenizer.save_pretrained(repo / folder)
    for folder in ("JoyAI-Image-Und", "processor"):
        write_json(repo / folder / "preprocessor_config.json", QWEN3_VL_PREPROCESSOR_CONFIG)
    vae = tiny_wan_vae(seed)
    vae.save_pretrained(repo / "vae")
    write_original_vae(repo / JOYAI_IMAGE_PATTERNS["vae"], vae)
    write_json(repo / "scheduler" / "scheduler_config.json", SCHEDULER_CONFIG)
    write_json(repo / "model_index.json", model_index("JoyImageEditPipeline", _COMPONENTS))
    return repo


JOYAI_IMAGE_BUILDERS = {"joyai_image_edit": build_tiny_joyai_image_edit}
