#!/usr/bin/env bash
# Full fine-tune of the Qwen-Image-Layered transformer: decomposing an RGBA image into layers. The reference's command:
# DeepSpeed ZeRO-2 on 8 GPUs with the optimizer on the CPU (full/accelerate_config_zero2offload.yaml). Run from the
# repository root.
#
# The dataset is a folder of RGBA images plus metadata.json, a list of objects with image (a list: the composite,
# then each layer), layer_input_image (the image to decompose), layer_num (the number of layers) and prompt. To try
# the command on a small procedurally drawn one:
#   python -m diffsynth.core.data.example_layered_dataset --output data/example_layered_dataset
# The model files are read from DIFFSYNTH_MODEL_BASE_PATH (default ./models) and downloaded there when missing.
set -e

accelerate launch --config_file examples/qwen_image/model_training/full/accelerate_config_zero2offload.yaml examples/qwen_image/model_training/train.py \
  --dataset_base_path data/example_layered_dataset \
  --dataset_metadata_path data/example_layered_dataset/metadata.json \
  --data_file_keys "image,layer_input_image" \
  --max_pixels 1048576 \
  --dataset_repeat 50 \
  --model_id_with_origin_paths "Qwen/Qwen-Image-Layered:transformer/diffusion_pytorch_model*.safetensors,Qwen/Qwen-Image:text_encoder/model*.safetensors,Qwen/Qwen-Image-Layered:vae/diffusion_pytorch_model.safetensors" \
  --learning_rate 1e-5 \
  --num_epochs 2 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Qwen-Image-Layered_full" \
  --trainable_models "dit" \
  --extra_inputs "layer_num,layer_input_image" \
  --use_gradient_checkpointing \
  --dataset_num_workers 8 \
  --find_unused_parameters
