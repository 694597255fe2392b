"""The original Wan code's layer names (what ComfyUI, DiffSynth-Studio and musubi-tuner run) for LoRA files, VACE's
``vace_blocks`` and the Fun releases' ``ref_conv`` and camera ``control_adapter`` included."""

from ...diffusion.module_naming import ModuleNaming

# From the original Wan code's module tree (its self_attn/cross_attn/ffn blocks and embedding Sequentials), as
# diffusers' own Wan checkpoint converter maps them.
NAMING = ModuleNaming(
    "original Wan",
    block_layers={
        "attn1.to_q": "self_attn.q", "attn1.to_k": "self_attn.k", "attn1.to_v": "self_attn.v",
        "attn1.to_out.0": "self_attn.o",
        "attn2.to_q": "cross_attn.q", "attn2.to_k": "cross_attn.k", "attn2.to_v": "cross_attn.v",
        "attn2.to_out.0": "cross_attn.o", "attn2.add_k_proj": "cross_attn.k_img",
        "attn2.add_v_proj": "cross_attn.v_img",
        "ffn.net.0.proj": "ffn.0", "ffn.net.2": "ffn.2",
        # Only in VACE blocks: the first one's input projection, every one's hint projection.
        "proj_in": "before_proj", "proj_out": "after_proj",
        # Wan2.2-Animate-2 (WanAnimate2Transformer3DModel): diffusers keeps the original module tree, less the
        # in-context wrapper of each block (blocks.N.block), and renames the attention projections only.
        **{f"{attention}.{ours}": f"block.{attention}.{theirs}" for attention in ("self_attn", "cross_attn")
           for ours, theirs in (("to_q", "q"), ("to_k", "k"), ("to_v", "v"), ("to_out.0", "o"))},
        "cross_attn.add_k_proj": "block.cross_attn.k_img", "cross_attn.add_v_proj": "block.cross_attn.v_img",
        "ffn.0": "block.ffn.0", "ffn.2": "block.ffn.2",
    },
    top_layers={
        "patch_embedding": "patch_embedding", "proj_out": "head.head",
        "condition_embedder.text_embedder.linear_1": "text_embedding.0",
        "condition_embedder.text_embedder.linear_2": "text_embedding.2",
        "condition_embedder.time_embedder.linear_1": "time_embedding.0",
        "condition_embedder.time_embedder.linear_2": "time_embedding.2",
        "condition_embedder.time_proj": "time_projection.1",
        "condition_embedder.image_embedder.ff.net.0.proj": "img_emb.proj.1",
        "condition_embedder.image_embedder.ff.net.2": "img_emb.proj.3",
        "vace_patch_embedding": "vace_patch_embedding",
        # The Fun releases' modules keep their names in WanFunTransformer3DModel (fun_model.py) and in ComfyUI's
        # WanModel / CameraWanModel; without an entry a LoRA on them could not be written in the universal layout.
        "ref_conv": "ref_conv", "control_adapter.conv": "control_adapter.conv",
        "control_adapter.residual_blocks.0.conv1": "control_adapter.residual_blocks.0.conv1",
        "control_adapter.residual_blocks.0.conv2": "control_adapter.residual_blocks.0.conv2",
    },
    other_block_lists=("vace_blocks",),
)  # fmt: skip
