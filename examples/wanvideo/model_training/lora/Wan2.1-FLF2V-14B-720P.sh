#!/usr/bin/env bash
# LoRA on Wan2.1-FLF2V-14B-720P (first-last-frame-to-video), the reference's command on the original release files.
# Run from the repository root.
# Wan2.1-FLF2V generates the frames between a first and a last image: both go to the VAE condition y and
# both images' CLIP tokens to the transformer's image cross-attention (its learned positions, img_emb.emb_pos, tell
# them apart). --extra_inputs input_image,end_image takes them from the metadata's input_image / end_image columns
# (add those to --data_file_keys), else from each clip's first and last frame, as the reference does.
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
  --model_id_with_origin_paths "Wan-AI/Wan2.1-FLF2V-14B-720P:diffusion_pytorch_model*.safetensors,Wan-AI/Wan2.1-FLF2V-14B-720P:models_t5_umt5-xxl-enc-bf16.pth,Wan-AI/Wan2.1-FLF2V-14B-720P:Wan2.1_VAE.pth,Wan-AI/Wan2.1-FLF2V-14B-720P:models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Wan2.1-FLF2V-14B-720P_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "q,k,v,o,ffn.0,ffn.2" \
  --lora_rank 32 \
  --extra_inputs "input_image,end_image"
