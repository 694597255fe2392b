#!/usr/bin/env bash
# Full fine-tune of the Qwen-Image-2512 transformer (with Qwen-Image's text encoder and VAE) (the reference's command:
# DeepSpeed ZeRO-2 on 8 GPUs with the optimizer kept on the CPU, by full/accelerate_config_zero2offload.yaml;
# full/accelerate_config.yaml keeps the optimizer on the GPUs and full/accelerate_config_zero3.yaml also partitions
# the weights over them). Run from the repository root.
#
# The dataset is a folder of images plus metadata.csv (columns image,prompt); to draw a small one:
#   python -m diffsynth.core.data.example_dataset --output data/example_image_dataset
# The model files are read from DIFFSYNTH_MODEL_BASE_PATH (default ./models) and downloaded there when missing:
# Qwen/Qwen-Image-2512's transformer/ shards, and Qwen/Qwen-Image's text encoder and VAE.
# Each epoch's transformer is written under --output_path as epoch-<e>.safetensors and the diffusers folder
# epoch-<e>.dit/ (how to load them:
# docs/en/Full_Fine_Tuning.md).
set -e

accelerate launch --config_file examples/qwen_image/model_training/full/accelerate_config_zero2offload.yaml examples/qwen_image/model_training/train.py \
  --dataset_base_path data/example_image_dataset \
  --dataset_metadata_path data/example_image_dataset/metadata.csv \
  --max_pixels 1048576 \
  --dataset_repeat 50 \
  --model_id_with_origin_paths "Qwen/Qwen-Image-2512:transformer/diffusion_pytorch_model*.safetensors,Qwen/Qwen-Image:text_encoder/model*.safetensors,Qwen/Qwen-Image:vae/diffusion_pytorch_model.safetensors" \
  --learning_rate 1e-5 \
  --num_epochs 2 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Qwen-Image-2512_full" \
  --trainable_models "dit" \
  --use_gradient_checkpointing \
  --find_unused_parameters
