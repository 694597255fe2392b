#!/usr/bin/env bash
# LoRA on Wan2.2-TI2V-5B, text-image-to-video: the reference's command on the original release files. Run from the
# repository root; make a dataset as for Wan2.1-T2V-1.3B.sh.
#
# The model works in the latent space of the Wan2.2 VAE (Wan2.2_VAE.pth: 16x spatial compression, 48 channels), so
# frame sizes are multiples of 32; others are rounded with a warning. With --extra_inputs input_image each sample's
# image (its input_image column, else its first frame) is encoded as the first latent frame, which the model sees at
# timestep 0 and the loss leaves out, as in diffusers' expand_timesteps; without it the model trains text-to-video.
set -e

accelerate launch examples/wanvideo/model_training/train.py \
  --dataset_base_path data/example_video_dataset \
  --dataset_metadata_path data/example_video_dataset/metadata.csv \
  --height 480 \
  --width 832 \
  --num_frames 49 \
  --dataset_repeat 100 \
  --model_id_with_origin_paths "Wan-AI/Wan2.2-TI2V-5B:diffusion_pytorch_model*.safetensors,Wan-AI/Wan2.2-TI2V-5B:models_t5_umt5-xxl-enc-bf16.pth,Wan-AI/Wan2.2-TI2V-5B:Wan2.2_VAE.pth" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Wan2.2-TI2V-5B_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "q,k,v,o,ffn.0,ffn.2" \
  --lora_rank 32 \
  --extra_inputs "input_image"
