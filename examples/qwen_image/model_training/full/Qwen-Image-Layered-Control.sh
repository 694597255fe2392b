#!/usr/bin/env bash
# Full fine-tune of the Qwen-Image-Layered-Control transformer (the reference's command: DeepSpeed ZeRO-2 on 8 GPUs
# with the optimizer kept on the CPU, by full/accelerate_config_zero2offload.yaml): extracting the one layer a prompt
# names from an RGBA image (layer_num 0). Run from the repository root.
#
# The dataset is a folder of RGBA images plus metadata.json, a list of objects with image (a list of one image: the
# layer), layer_input_image (the image to decompose), layer_num (0) and prompt (the layer).
# The reference downloads its example with
#   modelscope download --dataset DiffSynth-Studio/diffsynth_example_dataset --include "qwen_image/Qwen-Image-Layered-Control/*" --local_dir ./data/diffsynth_example_dataset
# and a small drawn one takes its place with
#   python -m diffsynth.core.data.example_layered_dataset --output data/diffsynth_example_dataset/qwen_image/Qwen-Image-Layered-Control --control layer
# The model files are read from DIFFSYNTH_MODEL_BASE_PATH (default ./models) and downloaded there when missing.
# Each epoch's transformer is written under --output_path (how to load it: docs/en/Full_Fine_Tuning.md).
set -e

accelerate launch --config_file examples/qwen_image/model_training/full/accelerate_config_zero2offload.yaml examples/qwen_image/model_training/train.py \
  --dataset_base_path data/diffsynth_example_dataset/qwen_image/Qwen-Image-Layered-Control \
  --dataset_metadata_path data/diffsynth_example_dataset/qwen_image/Qwen-Image-Layered-Control/metadata.json \
  --data_file_keys "image,layer_input_image" \
  --max_pixels 1048576 \
  --dataset_repeat 50 \
  --model_id_with_origin_paths "DiffSynth-Studio/Qwen-Image-Layered-Control:transformer/diffusion_pytorch_model*.safetensors,Qwen/Qwen-Image:text_encoder/model*.safetensors,Qwen/Qwen-Image-Layered:vae/diffusion_pytorch_model.safetensors" \
  --learning_rate 1e-5 \
  --num_epochs 2 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Qwen-Image-Layered-Control_full" \
  --trainable_models "dit" \
  --extra_inputs "layer_num,layer_input_image" \
  --use_gradient_checkpointing \
  --dataset_num_workers 8 \
  --find_unused_parameters
