"""Wan2.1 and Wan2.2 text-, image- and text-image-to-video: the family's spec (data only; see
``pipelines.registry``)."""

from ..registry import FamilySpec, LoraTools, OriginalCheckpoint, Release

_WAN21_T2V = dict(patch_size=(1, 2, 2), attention_head_dim=128, in_channels=16, out_channels=16, text_dim=4096,
                  freq_dim=256, cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
_SMALL, _LARGE = dict(num_attention_heads=12, ffn_dim=8960, num_layers=30), dict(num_attention_heads=40,
                                                                                ffn_dim=13824, num_layers=40)


def _wide(size: dict, in_channels: int, clip: bool = True, **extra) -> dict:
    """The config of a Wan transformer wider than text-to-video (image condition, Fun control latents), with the
    Wan2.1 image cross-attention on the CLIP ViT-H/14 features (1280 wide) where ``clip``."""
    image = dict(image_dim=1280, added_kv_proj_dim=size["num_attention_heads"] * 128) if clip else {}
    return dict(_WAN21_T2V, **size, in_channels=in_channels, **image, **extra)


# The PAI Fun releases (the reference's model_configs.py: in_dim, has_ref_conv, add_control_adapter): a Control
# model's input is the latents, 16 control latents and the image condition; the V1.1 and Wan2.2 Control models add
# ref_conv, the Control-Camera ones the camera adapter (24 channels), both WanFunTransformer3DModel. The Control ids are
# exact: a pattern ending in * would name the Control-Camera release too.
_FUN = "WanFunTransformer3DModel"
_FUN_RELEASES = (
    Release("wan2.1-i2v-14b", _wide(_LARGE, 36), ("Wan-AI/Wan2.1-I2V-14B-*", "PAI/Wan2.1-Fun-14B-InP*",
                                                  "PAI/Wan2.1-Fun-V1.1-14B-InP*")),
    Release("wan2.1-fun-inp-1.3b", _wide(_SMALL, 36), ("PAI/Wan2.1-Fun-1.3B-InP*", "PAI/Wan2.1-Fun-V1.1-1.3B-InP*")),
    # FLF2V: learned positions for two images' CLIP tokens.
    Release("wan2.1-flf2v-14b", _wide(_LARGE, 36, pos_embed_seq_len=2 * 257), ("Wan-AI/Wan2.1-FLF2V-14B-*",)),
    Release("wan2.1-fun-control-1.3b", _wide(_SMALL, 48), ("PAI/Wan2.1-Fun-1.3B-Control",)),
    Release("wan2.1-fun-control-14b", _wide(_LARGE, 48), ("PAI/Wan2.1-Fun-14B-Control",)),
    Release("wan2.1-fun-v1.1-control-1.3b", _wide(_SMALL, 48, reference_conv=True),
            ("PAI/Wan2.1-Fun-V1.1-1.3B-Control",), _FUN),
    Release("wan2.1-fun-v1.1-control-14b", _wide(_LARGE, 48, reference_conv=True),
            ("PAI/Wan2.1-Fun-V1.1-14B-Control",), _FUN),
    Release("wan2.1-fun-v1.1-control-camera-1.3b", _wide(_SMALL, 32, camera_channels=24),
            ("PAI/Wan2.1-Fun-V1.1-1.3B-Control-Camera*",), _FUN),
    Release("wan2.1-fun-v1.1-control-camera-14b", _wide(_LARGE, 32, camera_channels=24),
            ("PAI/Wan2.1-Fun-V1.1-14B-Control-Camera*",), _FUN),
    # Wan2.2 A14B, each expert: no CLIP; the image condition is 4 mask channels and 16 latents.
    Release("wan2.2-i2v-a14b", _wide(_LARGE, 36, clip=False), ("Wan-AI/Wan2.2-I2V-A14B*", "PAI/Wan2.2-Fun-A14B-InP*")),
    Release("wan2.2-fun-a14b-control", _wide(_LARGE, 52, clip=False, reference_conv=True),
            ("PAI/Wan2.2-Fun-A14B-Control",), _FUN),
    Release("wan2.2-fun-a14b-control-camera", _wide(_LARGE, 36, clip=False, camera_channels=24),
            ("PAI/Wan2.2-Fun-A14B-Control-Camera*",), _FUN),
)


SPEC = FamilySpec(
    name="wan_video",
    title="Wan",
    pipeline="diffsynth.pipelines.wan_video:WanVideoPipeline",
    plan_name="wan",
    denoiser_class="WanTransformer3DModel",
    # The PAI Fun Control / Control-Camera DiT (fun_model.py): diffusers' class plus ref_conv and a camera adapter.
    video=True,
    model_ids=("Wan-AI/Wan2.1-T2V-1.3B", "Wan-AI/Wan2.1-T2V-14B", "Wan-AI/Wan2.1-I2V-14B-480P",
               "Wan-AI/Wan2.1-I2V-14B-720P", "Wan-AI/Wan2.2-T2V-A14B", "Wan-AI/Wan2.2-I2V-A14B",
               "Wan-AI/Wan2.2-TI2V-5B", "Wan-AI/Wan2.1-FLF2V-14B-720P", "PAI/Wan2.1-Fun-1.3B-InP",
               "PAI/Wan2.1-Fun-14B-InP", "PAI/Wan2.1-Fun-V1.1-1.3B-InP", "PAI/Wan2.1-Fun-V1.1-14B-InP",
               "PAI/Wan2.2-Fun-A14B-InP", "PAI/Wan2.1-Fun-1.3B-Control", "PAI/Wan2.1-Fun-14B-Control",
               "PAI/Wan2.1-Fun-V1.1-1.3B-Control", "PAI/Wan2.1-Fun-V1.1-14B-Control",
               "PAI/Wan2.1-Fun-V1.1-1.3B-Control-Camera", "PAI/Wan2.1-Fun-V1.1-14B-Control-Camera",
               "PAI/Wan2.2-Fun-A14B-Control", "PAI/Wan2.2-Fun-A14B-Control-Camera", "Wan-AI/Wan2.1-VACE-1.3B",
               "Wan-AI/Wan2.1-VACE-14B", "iic/VACE-Wan2.1-1.3B-Preview", "PAI/Wan2.2-VACE-Fun-A14B",
               "Wan-AI/Wan2.2-Animate-14B", "Wan-AI/Wan2.2-Animate-2-14B"),
    releases=(
        Release("wan2.1-t2v-14b", dict(_WAN21_T2V, num_attention_heads=40, ffn_dim=13824, num_layers=40),
                ("Wan-AI/Wan2.1-T2V-14B*",)),
        Release("wan2.1-t2v-1.3b", dict(_WAN21_T2V, num_attention_heads=12, ffn_dim=8960, num_layers=30),
                ("Wan-AI/Wan2.1-T2V-1.3B*",)),
        # VACE: vace_layers as the releases' config.json list them (every second block of 1.3B, every fifth of 14B).
        Release("wan2.1-vace-1.3b", dict(_WAN21_T2V, num_attention_heads=12, ffn_dim=8960, num_layers=30,
                                         vace_layers=list(range(0, 30, 2)), vace_in_channels=96),
                ("Wan-AI/Wan2.1-VACE-1.3B*", "iic/VACE-Wan2.1-1.3B*"), "WanVACETransformer3DModel"),
        Release("wan2.1-vace-14b", dict(_WAN21_T2V, num_attention_heads=40, ffn_dim=13824, num_layers=40,
                                        vace_layers=list(range(0, 40, 5)), vace_in_channels=96),
                ("Wan-AI/Wan2.1-VACE-14B*", "PAI/Wan2.2-VACE-Fun-A14B*"), "WanVACETransformer3DModel"),
        # Animate: a Wan2.1 I2V-14B with the pose embedding, the 512-pixel motion encoder, the face encoder and a
        # face adapter after every fifth block (diffusers' defaults are the release's).
        Release("wan2.2-animate-14b", dict(_WAN21_T2V, num_attention_heads=40, ffn_dim=13824, num_layers=40,
                                           in_channels=36, image_dim=1280, added_kv_proj_dim=5120),
                ("Wan-AI/Wan2.2-Animate-14B*",), "WanAnimateTransformer3DModel"),
        *_FUN_RELEASES,
    ),
    layouts=("diffusers", "original Wan (WanModel / VaceWanModel / Animate folders, .pth encoders and VAEs)"),
    original_readers=("diffsynth.pipelines.wan_video.original:identify",),
    original_checkpoint=OriginalCheckpoint("diffsynth.pipelines.wan_video.original:dit_to_original",
                                           "diffsynth.pipelines.wan_video.original:dit_original_config"),
    # UMT5 pads every prompt to 512 tokens.
    prompt_tokens=512,
    scheduler_presets={"wan": dict(shift=5.0)},
    lora_tools=LoraTools("WanLoraLoaderMixin"),
    refused_model_ids={
        "Wan-AI/Wan2.2-S2V-": "Wan2.2-S2V (speech-to-video) is not supported here",
        "Wan-AI/Wan-Dancer-": "Wan-Dancer (music-to-dance video, the WanToDance models) is not supported here",
        "DiffSynth-Studio/Wan2.1-1.3b-speedcontrol-": "the Wan2.1 speed-control motion adapter is not supported here",
        "krea/krea-realtime-video": "krea-realtime-video is not supported here; train Wan-AI/Wan2.1-T2V-14B",
    },
    reference_flags=("--audio_processor_path", "--min_timestep_boundary", "--max_timestep_boundary",
                     "--framewise_decoding"),
    example_folder="examples/wanvideo/model_training",
    docs_page="Wan.md",
    other_denoiser_classes=("WanVACETransformer3DModel", "WanFunTransformer3DModel", "WanAnimateTransformer3DModel",
                            "WanAnimate2Transformer3DModel"),
)
