#!/usr/bin/env bash
# Full fine-tune of the Krea-2-Turbo transformer: the reference's command. Run from the repository root; run
# `accelerate config` first for several GPUs or DeepSpeed.
#
# The dataset and model files are as in ../lora/Krea-2-Turbo.sh. The transformer is written to the --output_path as
# epoch-<e>.safetensors in diffusers' names; --full_checkpoint_format original writes Krea's layout (turbo.safetensors).
set -e

accelerate launch examples/krea2/model_training/train.py \
  --dataset_base_path data/diffsynth_example_dataset/krea2/Krea-2-Turbo \
  --dataset_metadata_path data/diffsynth_example_dataset/krea2/Krea-2-Turbo/metadata.csv \
  --max_pixels 1048576 \
  --dataset_repeat 50 \
  --model_id_with_origin_paths "krea/Krea-2-Turbo:turbo.safetensors,Qwen/Qwen3-VL-4B-Instruct:*.safetensors,Qwen/Qwen-Image:vae/diffusion_pytorch_model.safetensors" \
  --tokenizer_path "Qwen/Qwen3-VL-4B-Instruct:" \
  --learning_rate 1e-5 \
  --num_epochs 2 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Krea-2-Turbo_full" \
  --trainable_models "dit" \
  --use_gradient_checkpointing \
  --find_unused_parameters
