#!/usr/bin/env bash
# Full fine-tune of the FLUX.1-dev transformer (the reference's command: DeepSpeed ZeRO-2 on 8 GPUs by full/accelerate_config.yaml; full/accelerate_config_zero2offload.yaml keeps the optimizer on the CPU). Run from the repository root.
#
# The dataset is a folder of images plus metadata.csv (columns image,prompt); to draw a small one:
#  python -m diffsynth.core.data.example_dataset --output data/example_image_dataset
# The model files are read from DIFFSYNTH_MODEL_BASE_PATH (default ./models) and downloaded there when missing:
# FLUX.1-dev's single-file transformer and FLUX.1-dev's CLIP, T5 and ae.safetensors, as BFL released them.
set -e

accelerate launch --config_file examples/flux/model_training/full/accelerate_config.yaml examples/flux/model_training/train.py \
  --dataset_base_path data/example_image_dataset \
  --dataset_metadata_path data/example_image_dataset/metadata.csv \
  --max_pixels 1048576 \
  --dataset_repeat 400 \
  --model_id_with_origin_paths "black-forest-labs/FLUX.1-dev:flux1-dev.safetensors,black-forest-labs/FLUX.1-dev:text_encoder/model.safetensors,black-forest-labs/FLUX.1-dev:text_encoder_2/*.safetensors,black-forest-labs/FLUX.1-dev:ae.safetensors" \
  --learning_rate 1e-5 \
  --num_epochs 1 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/FLUX.1-dev_full" \
  --trainable_models "dit" \
  --use_gradient_checkpointing
