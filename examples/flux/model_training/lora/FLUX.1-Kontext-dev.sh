#!/usr/bin/env bash
# LoRA on the FLUX.1-Kontext-dev transformer, trained in one stage (the reference's command). Run from the repository root.
#
# The dataset is a folder of images plus metadata.csv (columns image,kontext_images,prompt: the target, the
# reference image and the instruction); to draw a small one:
#  python -m diffsynth.core.data.example_edit_dataset --output data/example_kontext_dataset --column kontext_images
# The model files are read from DIFFSYNTH_MODEL_BASE_PATH (default ./models) and downloaded there when missing:
# FLUX.1-Kontext-dev's single-file transformer and FLUX.1-dev's CLIP, T5 and ae.safetensors, as BFL released them.
# The reference's module names in --lora_target_modules (a_to_qkv, to_qkv_mlp, ...) are mapped to diffusers'
# modules (docs/en/FLUX.md).
set -e

accelerate launch examples/flux/model_training/train.py \
  --dataset_base_path data/example_kontext_dataset \
  --dataset_metadata_path data/example_kontext_dataset/metadata.csv \
  --data_file_keys "image,kontext_images" \
  --max_pixels 1048576 \
  --dataset_repeat 400 \
  --model_id_with_origin_paths "black-forest-labs/FLUX.1-Kontext-dev:flux1-kontext-dev.safetensors,black-forest-labs/FLUX.1-dev:text_encoder/model.safetensors,black-forest-labs/FLUX.1-dev:text_encoder_2/*.safetensors,black-forest-labs/FLUX.1-dev:ae.safetensors" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/FLUX.1-Kontext-dev_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "a_to_qkv,b_to_qkv,ff_a.0,ff_a.2,ff_b.0,ff_b.2,a_to_out,b_to_out,proj_out,norm.linear,norm1_a.linear,norm1_b.linear,to_qkv_mlp" \
  --lora_rank 32 \
  --align_to_opensource_format \
  --extra_inputs "kontext_images" \
  --use_gradient_checkpointing
