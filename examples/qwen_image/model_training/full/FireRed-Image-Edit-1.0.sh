#!/usr/bin/env bash
# Full fine-tune on the FireRed-Image-Edit-1.0 transformer (FireRedTeam's edit model on the Qwen-Image-Edit
# architecture, which diffusers runs with QwenImageEditPlusPipeline): image editing with one or more edit images per
# sample. Trained as a plain fine-tune (the reference's command: DeepSpeed
# ZeRO-2 on 8 GPUs with the optimizer on the CPU, by full/accelerate_config_zero2offload.yaml). Run from the repository root.
#
# The dataset is a folder of images plus metadata.json, a list of objects with image (the result), edit_image (a list
# of paths, even for one image) and prompt. To try the command on a small procedurally drawn dataset:
#   python -m diffsynth.core.data.example_edit_dataset --output data/example_edit_pairs_dataset --num_edit_images 2
# The model files are read from DIFFSYNTH_MODEL_BASE_PATH (default ./models) and downloaded there when missing; the
# Qwen2.5-VL processor comes from FireRedTeam/FireRed-Image-Edit-1.0:processor/.
set -e

accelerate launch --config_file examples/qwen_image/model_training/full/accelerate_config_zero2offload.yaml examples/qwen_image/model_training/train.py \
  --dataset_base_path data/example_edit_pairs_dataset \
  --dataset_metadata_path data/example_edit_pairs_dataset/metadata.json \
  --data_file_keys "image,edit_image" \
  --extra_inputs "edit_image" \
  --max_pixels 1048576 \
  --dataset_repeat 50 \
  --model_id_with_origin_paths "FireRedTeam/FireRed-Image-Edit-1.0:transformer/diffusion_pytorch_model*.safetensors,Qwen/Qwen-Image:text_encoder/model*.safetensors,Qwen/Qwen-Image:vae/diffusion_pytorch_model.safetensors" \
  --learning_rate 1e-5 \
  --num_epochs 2 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/FireRed-Image-Edit-1.0_full" \
  --trainable_models "dit" \
  --use_gradient_checkpointing \
  --find_unused_parameters
