#!/usr/bin/env bash
# Full fine-tune of the FLUX.2-klein-4B transformer (the reference's command). Run from the repository root.
#
# The dataset is a folder of images plus metadata.csv (columns image,prompt); to draw a small one:
#  python -m diffsynth.core.data.example_dataset --output <folder>
# The model files are read from DIFFSYNTH_MODEL_BASE_PATH (default ./models) and downloaded there when missing.
# Edit (commented below): reference images in the edit_image column (metadata.json), as for Qwen-Image-Edit-2511;
# to draw a small dataset:  python -m diffsynth.core.data.example_edit_dataset --output <folder> --num_edit_images 2
set -e

accelerate launch examples/flux2/model_training/train.py \
  --dataset_base_path data/example_image_dataset \
  --dataset_metadata_path data/example_image_dataset/metadata.csv \
  --max_pixels 1048576 \
  --dataset_repeat 50 \
  --model_id_with_origin_paths "black-forest-labs/FLUX.2-klein-4B:text_encoder/*.safetensors,black-forest-labs/FLUX.2-klein-4B:transformer/*.safetensors,black-forest-labs/FLUX.2-klein-4B:vae/diffusion_pytorch_model.safetensors" \
  --tokenizer_path "black-forest-labs/FLUX.2-klein-4B:tokenizer/" \
  --learning_rate 1e-5 \
  --num_epochs 2 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/FLUX.2-klein-4B_full" \
  --trainable_models "dit" \
  --use_gradient_checkpointing

# Edit

# accelerate launch examples/flux2/model_training/train.py \
#   --dataset_base_path data/example_edit_dataset \
#   --dataset_metadata_path data/example_edit_dataset/metadata.json \
#   --data_file_keys "image,edit_image" \
#   --extra_inputs "edit_image" \
#   --max_pixels 1048576 \
#   --dataset_repeat 50 \
#   --model_id_with_origin_paths "black-forest-labs/FLUX.2-klein-4B:text_encoder/*.safetensors,black-forest-labs/FLUX.2-klein-4B:transformer/*.safetensors,black-forest-labs/FLUX.2-klein-4B:vae/diffusion_pytorch_model.safetensors" \
#   --tokenizer_path "black-forest-labs/FLUX.2-klein-4B:tokenizer/" \
#   --learning_rate 1e-5 \
#   --num_epochs 2 \
#   --remove_prefix_in_ckpt "pipe.dit." \
#   --output_path "./models/train/FLUX.2-klein-4B_full" \
#   --trainable_models "dit" \
#   --use_gradient_checkpointing
