#!/usr/bin/env bash
# LoRAs on the two experts of PAI/Wan2.2-Fun-A14B-InP (first/last-frame inpainting), one run per expert
# as in the reference. Run from the repository root.
# Wan2.2-Fun-A14B-InP has two experts and no CLIP encoder; each is trained in its own run, on its timesteps
# (the release switches experts at timestep 900 of 1000, fraction 0.358 of the trainer's shifted grid). The first and
# last frames go to the VAE condition y: --extra_inputs input_image,end_image takes the metadata's columns of those
# names (add them to --data_file_keys), else each clip's first and last frame, as the reference does.
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
  --model_id_with_origin_paths "PAI/Wan2.2-Fun-A14B-InP:high_noise_model/diffusion_pytorch_model*.safetensors,PAI/Wan2.2-Fun-A14B-InP:models_t5_umt5-xxl-enc-bf16.pth,PAI/Wan2.2-Fun-A14B-InP:Wan2.1_VAE.pth" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Wan2.2-Fun-A14B-InP_high_noise_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "q,k,v,o,ffn.0,ffn.2" \
  --lora_rank 32 \
  --extra_inputs "input_image,end_image" \
  --max_timestep_boundary 0.358 \
  --min_timestep_boundary 0
# the high-noise expert: timesteps [900, 1000]

accelerate launch examples/wanvideo/model_training/train.py \
  --dataset_base_path data/example_video_dataset \
  --dataset_metadata_path data/example_video_dataset/metadata.csv \
  --height 480 \
  --width 832 \
  --num_frames 49 \
  --dataset_repeat 100 \
  --model_id_with_origin_paths "PAI/Wan2.2-Fun-A14B-InP:low_noise_model/diffusion_pytorch_model*.safetensors,PAI/Wan2.2-Fun-A14B-InP:models_t5_umt5-xxl-enc-bf16.pth,PAI/Wan2.2-Fun-A14B-InP:Wan2.1_VAE.pth" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Wan2.2-Fun-A14B-InP_low_noise_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "q,k,v,o,ffn.0,ffn.2" \
  --lora_rank 32 \
  --extra_inputs "input_image,end_image" \
  --max_timestep_boundary 1 \
  --min_timestep_boundary 0.358
# the low-noise expert: timesteps [0, 900)
