#!/usr/bin/env bash
# LoRA on the 14B Wan2.1 text-to-video transformer: the reference's command on the original release files of
# Wan-AI/Wan2.1-T2V-14B. Run from the repository root; the flags are as in lora/Wan2.1-T2V-1.3B.sh.
# Make a dataset as for lora/Wan2.1-T2V-1.3B.sh (clips of at least --num_frames frames plus metadata.csv);
# --num_frames 49 is written out where the reference's command leaves the default (81).
set -e

accelerate launch examples/wanvideo/model_training/train.py \
  --dataset_base_path data/example_video_dataset \
  --dataset_metadata_path data/example_video_dataset/metadata.csv \
  --height 480 \
  --width 832 \
  --num_frames 49 \
  --dataset_repeat 100 \
  --model_id_with_origin_paths "Wan-AI/Wan2.1-T2V-14B:diffusion_pytorch_model*.safetensors,Wan-AI/Wan2.1-T2V-14B:models_t5_umt5-xxl-enc-bf16.pth,Wan-AI/Wan2.1-T2V-14B:Wan2.1_VAE.pth" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Wan2.1-T2V-14B_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "q,k,v,o,ffn.0,ffn.2" \
  --lora_rank 32
