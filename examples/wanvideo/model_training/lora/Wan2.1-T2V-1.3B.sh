#!/usr/bin/env bash
# LoRA on the Wan2.1 text-to-video transformer (1.3B), trained in one stage. Run from the repository root.
#
# The command is the reference's (DiffSynth-Studio), on the original release files of Wan-AI/Wan2.1-T2V-1.3B: the
# transformer's shards and config.json, the UMT5 encoder and the VAE as .pth files, read into diffusers' and
# transformers' classes (the tokenizer comes from the repository's google/umt5-xxl/). The -Diffusers repository works
# too: name its transformer/, text_encoder/ and vae/ files instead (see docs/en/Wan.md).
#
# The dataset is a folder of clips plus metadata.csv (columns video,prompt). Each sample is the first --num_frames
# frames of its clip (a count of the form 4k+1; the reference's default is 81), so every clip needs at least that
# many; a shorter one stops the run before the models load. To try the command on a small drawn dataset:
#   python -m diffsynth.core.data.example_dataset --kind video --num_frames 49 --output data/example_video_dataset
# The model files are read from DIFFSYNTH_MODEL_BASE_PATH (default ./models) and downloaded there when missing.
# --lora_target_modules takes the original Wan layer names; they select the same layers of diffusers' model
# (to_q, to_k, to_v, to_out.0, ffn.net.0.proj, ffn.net.2) in self- and cross-attention. Gradient checkpointing is
# always on for Wan, as in the reference. The LoRA is written to --output_path as epoch-<e>.safetensors (it loads in
# ComfyUI, diffusers and DiffSynth-Studio: docs/en/Using_LoRA.md); try it with
# examples/wanvideo/model_training/validate_lora/Wan2.1-T2V-1.3B.py.
set -e

accelerate launch examples/wanvideo/model_training/train.py \
  --dataset_base_path data/example_video_dataset \
  --dataset_metadata_path data/example_video_dataset/metadata.csv \
  --height 480 \
  --width 832 \
  --num_frames 49 \
  --dataset_repeat 100 \
  --model_id_with_origin_paths "Wan-AI/Wan2.1-T2V-1.3B:diffusion_pytorch_model*.safetensors,Wan-AI/Wan2.1-T2V-1.3B:models_t5_umt5-xxl-enc-bf16.pth,Wan-AI/Wan2.1-T2V-1.3B:Wan2.1_VAE.pth" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Wan2.1-T2V-1.3B_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "q,k,v,o,ffn.0,ffn.2" \
  --lora_rank 32
