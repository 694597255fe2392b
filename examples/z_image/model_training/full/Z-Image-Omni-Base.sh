#!/usr/bin/env bash
# Full fine-tune of the Z-Image-Omni-Base transformer on 8 GPUs (the reference tested it on 8 A100s) under
# DeepSpeed ZeRO-2 (full/accelerate_config.yaml; accelerate_config_zero3.yaml shards the weights too): the
# reference's command. Run from the repository root. The commented command trains with condition images.
#
# The dataset is a folder of images plus metadata.csv (columns image,prompt). To try the command on a small
# procedurally drawn one:  python -m diffsynth.core.data.example_dataset --output data/example_image_dataset
# With condition images:  python -m diffsynth.core.data.example_edit_dataset --output data/example_edit_dataset
# The model files are read from DIFFSYNTH_MODEL_BASE_PATH (default ./models) and downloaded there when missing.
# epoch-<e>.safetensors holds the whole transformer's weights under their diffusers names.
set -e

# Text to image training
accelerate launch --config_file examples/z_image/model_training/full/accelerate_config.yaml examples/z_image/model_training/train.py \
  --dataset_base_path data/example_image_dataset \
  --dataset_metadata_path data/example_image_dataset/metadata.csv \
  --max_pixels 1048576 \
  --dataset_repeat 400 \
  --model_id_with_origin_paths "Tongyi-MAI/Z-Image-Omni-Base:transformer/*.safetensors,Tongyi-MAI/Z-Image-Omni-Base:siglip/model.safetensors,Tongyi-MAI/Z-Image-Turbo:text_encoder/*.safetensors,Tongyi-MAI/Z-Image-Turbo:vae/diffusion_pytorch_model.safetensors" \
  --learning_rate 1e-5 \
  --num_epochs 2 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Z-Image-Omni-Base_full" \
  --trainable_models "dit" \
  --use_gradient_checkpointing \
  --find_unused_parameters \
  --dataset_num_workers 8

# Image(s) to image training
# accelerate launch --config_file examples/z_image/model_training/full/accelerate_config.yaml examples/z_image/model_training/train.py \
#   --dataset_base_path data/example_edit_dataset \
#   --dataset_metadata_path data/example_edit_dataset/metadata.json \
#   --data_file_keys "image,edit_image" \
#   --extra_inputs "edit_image" \
#   --max_pixels 1048576 \
#   --dataset_repeat 400 \
#   --model_id_with_origin_paths "Tongyi-MAI/Z-Image-Omni-Base:transformer/*.safetensors,Tongyi-MAI/Z-Image-Omni-Base:siglip/model.safetensors,Tongyi-MAI/Z-Image-Turbo:text_encoder/*.safetensors,Tongyi-MAI/Z-Image-Turbo:vae/diffusion_pytorch_model.safetensors" \
#   --learning_rate 1e-5 \
#   --num_epochs 2 \
#   --remove_prefix_in_ckpt "pipe.dit." \
#   --output_path "./models/train/Z-Image-Omni-Base_full_edit" \
#   --trainable_models "dit" \
#   --use_gradient_checkpointing \
#   --find_unused_parameters \
#   --dataset_num_workers 8
