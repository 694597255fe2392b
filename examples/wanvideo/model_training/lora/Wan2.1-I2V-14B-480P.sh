#!/usr/bin/env bash
# LoRA on the Wan2.1 image-to-video transformer (14B, 480P), the reference's command on the original release files.
# Run from the repository root.
#
# --extra_inputs input_image conditions each sample on an image: the metadata's input_image column when it has one
# (add input_image to --data_file_keys so the file is loaded), else the first frame of the clip, as the reference
# takes it. The CLIP image encoder (models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth) is read as transformers'
# CLIPVisionModel; only its vision tower is loaded. Make a dataset as for ../lora/Wan2.1-T2V-1.3B.sh; see that script
# for the other flags.
set -e

accelerate launch examples/wanvideo/model_training/train.py \
  --dataset_base_path data/example_video_dataset \
  --dataset_metadata_path data/example_video_dataset/metadata.csv \
  --height 480 \
  --width 832 \
  --num_frames 49 \
  --dataset_repeat 100 \
  --model_id_with_origin_paths "Wan-AI/Wan2.1-I2V-14B-480P:diffusion_pytorch_model*.safetensors,Wan-AI/Wan2.1-I2V-14B-480P:models_t5_umt5-xxl-enc-bf16.pth,Wan-AI/Wan2.1-I2V-14B-480P:Wan2.1_VAE.pth,Wan-AI/Wan2.1-I2V-14B-480P:models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Wan2.1-I2V-14B-480P_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "q,k,v,o,ffn.0,ffn.2" \
  --lora_rank 32 \
  --extra_inputs "input_image"
