#!/usr/bin/env bash
# Full fine-tune of the Qwen-Image-Edit-2511 transformer: image editing with several edit images per sample (the
# reference's command: DeepSpeed ZeRO-2 on 8 GPUs with the optimizer kept on the CPU, by
# full/accelerate_config_zero2offload.yaml; full/accelerate_config.yaml keeps the optimizer on the GPUs and
# full/accelerate_config_zero3.yaml also partitions the weights over them). Run from the repository root.
#
# The dataset is as for Qwen-Image-Edit-2509.sh; to draw a small one:
#   python -m diffsynth.core.data.example_edit_dataset --output data/example_edit_pairs_dataset --num_edit_images 2
# --zero_cond_t modulates the edit images' tokens as at timestep 0, as 2511 was trained (the released transformer's
# config.json turns it on too; the flag, kept from the reference command, makes sure).
# The model files are read from DIFFSYNTH_MODEL_BASE_PATH (default ./models) and downloaded there when missing:
# Qwen/Qwen-Image-Edit-2511's transformer/ shards and processor/, and Qwen/Qwen-Image's text encoder and VAE.
# Each epoch's transformer is written under --output_path as epoch-<e>.safetensors and the diffusers folder
# epoch-<e>.dit/ (how to load them:
# docs/en/Full_Fine_Tuning.md).
set -e

accelerate launch --config_file examples/qwen_image/model_training/full/accelerate_config_zero2offload.yaml examples/qwen_image/model_training/train.py \
  --dataset_base_path data/example_edit_pairs_dataset \
  --dataset_metadata_path data/example_edit_pairs_dataset/metadata.json \
  --data_file_keys "image,edit_image" \
  --extra_inputs "edit_image" \
  --max_pixels 1048576 \
  --dataset_repeat 50 \
  --model_id_with_origin_paths "Qwen/Qwen-Image-Edit-2511:transformer/diffusion_pytorch_model*.safetensors,Qwen/Qwen-Image:text_encoder/model*.safetensors,Qwen/Qwen-Image:vae/diffusion_pytorch_model.safetensors" \
  --learning_rate 1e-5 \
  --num_epochs 2 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Qwen-Image-Edit-2511_full" \
  --trainable_models "dit" \
  --use_gradient_checkpointing \
  --find_unused_parameters \
  --zero_cond_t # 2511 only: edit-image tokens modulated as at timestep 0
