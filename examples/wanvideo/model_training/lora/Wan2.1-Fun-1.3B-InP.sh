#!/usr/bin/env bash
# LoRA on PAI/Wan2.1-Fun-1.3B-InP (first/last-frame inpainting), the reference's command on the PAI release
# files. Run from the repository root.
# The Fun InP models are Wan2.1 image-to-video transformers (36 input channels) trained by PAI to fill in a video
# from its first frame and, optionally, its last: both go to the VAE condition y (diffusers' last_image), and the
# first image's CLIP tokens to the image cross-attention. --extra_inputs input_image,end_image takes them from the
# metadata's input_image / end_image columns (add those to --data_file_keys), else from each clip's first and last
# frame, as the reference does.
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
  --model_id_with_origin_paths "PAI/Wan2.1-Fun-1.3B-InP:diffusion_pytorch_model*.safetensors,PAI/Wan2.1-Fun-1.3B-InP:models_t5_umt5-xxl-enc-bf16.pth,PAI/Wan2.1-Fun-1.3B-InP:Wan2.1_VAE.pth,PAI/Wan2.1-Fun-1.3B-InP:models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Wan2.1-Fun-1.3B-InP_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "q,k,v,o,ffn.0,ffn.2" \
  --lora_rank 32 \
  --extra_inputs "input_image,end_image"
