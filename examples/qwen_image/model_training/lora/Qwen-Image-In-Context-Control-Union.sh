#!/usr/bin/env bash
# LoRA of Qwen-Image for in-context control (the reference's command): each sample's context_image (a pose, edge,
# depth, line-art or normal map of the target) is encoded and read by the transformer after the generated image's
# tokens, and the LoRA learns to follow it. It starts from DiffSynth-Studio's released LoRA, read from the local
# path --lora_checkpoint names; fetch it first with
#   modelscope download --model DiffSynth-Studio/Qwen-Image-In-Context-Control-Union model.safetensors --local_dir models/DiffSynth-Studio/Qwen-Image-In-Context-Control-Union
# or drop --lora_checkpoint to train from scratch. Run from the repository root.
#
# The dataset is a folder of images plus metadata.csv (columns image,context_image,prompt; the reference's prompts
# start with "Context_Control. ", as in its inference example).
# The reference downloads its example with
#   modelscope download --dataset DiffSynth-Studio/diffsynth_example_dataset --include "qwen_image/Qwen-Image-In-Context-Control-Union/*" --local_dir ./data/diffsynth_example_dataset
# and a small drawn one (a source image as the control of each edit) takes its place with
#   python -m diffsynth.core.data.example_edit_dataset --output data/diffsynth_example_dataset/qwen_image/Qwen-Image-In-Context-Control-Union --column context_image
# The model files are read from DIFFSYNTH_MODEL_BASE_PATH (default ./models) and downloaded there when missing.
set -e

accelerate launch examples/qwen_image/model_training/train.py \
  --dataset_base_path data/diffsynth_example_dataset/qwen_image/Qwen-Image-In-Context-Control-Union \
  --dataset_metadata_path data/diffsynth_example_dataset/qwen_image/Qwen-Image-In-Context-Control-Union/metadata.csv \
  --data_file_keys "image,context_image" \
  --max_pixels 1048576 \
  --dataset_repeat 50 \
  --model_id_with_origin_paths "Qwen/Qwen-Image:transformer/diffusion_pytorch_model*.safetensors,Qwen/Qwen-Image:text_encoder/model*.safetensors,Qwen/Qwen-Image:vae/diffusion_pytorch_model.safetensors" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Qwen-Image-In-Context-Control-Union_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "to_q,to_k,to_v,add_q_proj,add_k_proj,add_v_proj,to_out.0,to_add_out,img_mlp.net.2,img_mod.1,txt_mlp.net.2,txt_mod.1" \
  --lora_rank 64 \
  --lora_checkpoint "models/DiffSynth-Studio/Qwen-Image-In-Context-Control-Union/model.safetensors" \
  --extra_inputs "context_image" \
  --use_gradient_checkpointing \
  --find_unused_parameters

# if you want to train from scratch, you can remove the --lora_checkpoint argument
