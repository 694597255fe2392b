#!/usr/bin/env bash
# LoRA on the Stable Diffusion 1.5 UNet: the reference's command. Run from the repository root.
#
# The dataset is a folder of images plus metadata.csv (columns image,prompt). To try the command on a small
# procedurally drawn one:  python -m diffsynth.core.data.example_dataset --output <dataset folder>
# The model files are read from DIFFSYNTH_MODEL_BASE_PATH (default ./models) and downloaded there when missing.
# An empty --lora_target_modules trains every Linear layer of the UNet (its attention, feed-forward and time embedding
# projections). The LoRA is written to the --output_path as epoch-<e>.safetensors in kohya's layout
# (lora_unet_down_blocks_0_...), which diffusers' load_lora_weights and ComfyUI load at strength 1.0.
set -e

# The reference downloads its example dataset first:
#   modelscope download --dataset DiffSynth-Studio/diffsynth_example_dataset --include "stable_diffusion/stable-diffusion-v1-5/*" --local_dir ./data/diffsynth_example_dataset

accelerate launch examples/stable_diffusion/model_training/train.py \
  --dataset_base_path data/diffsynth_example_dataset/stable_diffusion/stable-diffusion-v1-5 \
  --dataset_metadata_path data/diffsynth_example_dataset/stable_diffusion/stable-diffusion-v1-5/metadata.csv \
  --height 512 \
  --width 512 \
  --dataset_repeat 50 \
  --model_id_with_origin_paths "AI-ModelScope/stable-diffusion-v1-5:text_encoder/model.safetensors,AI-ModelScope/stable-diffusion-v1-5:unet/diffusion_pytorch_model.safetensors,AI-ModelScope/stable-diffusion-v1-5:vae/diffusion_pytorch_model.safetensors" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.unet." \
  --output_path "./models/train/stable-diffusion-v1-5_lora" \
  --lora_base_model "unet" \
  --lora_target_modules "" \
  --lora_rank 32 \
  --use_gradient_checkpointing
