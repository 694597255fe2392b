#!/usr/bin/env bash
# Full fine-tune of the SDXL base UNet: the reference's command. Run from the repository root.
#
# The dataset is a folder of images plus metadata.csv (columns image,prompt). The model files are read from
# DIFFSYNTH_MODEL_BASE_PATH (default ./models) and downloaded there when missing. The UNet's weights are written to
# the --output_path as epoch-<e>.safetensors under diffusers' names (those of unet/).
set -e

# The reference downloads its example dataset first:
#   modelscope download --dataset DiffSynth-Studio/diffsynth_example_dataset --include "stable_diffusion_xl/stable-diffusion-xl-base-1.0/*" --local_dir ./data/diffsynth_example_dataset
accelerate launch examples/stable_diffusion_xl/model_training/train.py \
  --dataset_base_path data/diffsynth_example_dataset/stable_diffusion_xl/stable-diffusion-xl-base-1.0 \
  --dataset_metadata_path data/diffsynth_example_dataset/stable_diffusion_xl/stable-diffusion-xl-base-1.0/metadata.csv \
  --height 1024 \
  --width 1024 \
  --dataset_repeat 10 \
  --model_id_with_origin_paths "stabilityai/stable-diffusion-xl-base-1.0:text_encoder/model.safetensors,stabilityai/stable-diffusion-xl-base-1.0:text_encoder_2/model.safetensors,stabilityai/stable-diffusion-xl-base-1.0:unet/diffusion_pytorch_model.safetensors,stabilityai/stable-diffusion-xl-base-1.0:vae/diffusion_pytorch_model.safetensors" \
  --learning_rate 1e-5 \
  --num_epochs 2 \
  --trainable_models "unet" \
  --remove_prefix_in_ckpt "pipe.unet." \
  --output_path "./models/train/stable-diffusion-xl-base-1.0_full" \
  --use_gradient_checkpointing
