#!/usr/bin/env bash
# LoRA on DiffSynth-Studio's Qwen-Image-Distill-Full transformer (Qwen-Image distilled to sample in 15 steps without
# classifier-free guidance). Run from the repository root.
#
# The dataset is a folder of images plus metadata.csv (columns image,prompt); to draw a small one:
#   python -m diffsynth.core.data.example_dataset --output data/example_image_dataset
# The model files are read from DIFFSYNTH_MODEL_BASE_PATH (default ./models) and downloaded there when missing: the
# transformer shards at the root of DiffSynth-Studio/Qwen-Image-Distill-Full, and Qwen/Qwen-Image's text encoder and
# VAE.
set -e

accelerate launch examples/qwen_image/model_training/train.py \
  --dataset_base_path data/example_image_dataset \
  --dataset_metadata_path data/example_image_dataset/metadata.csv \
  --max_pixels 1048576 \
  --dataset_repeat 50 \
  --model_id_with_origin_paths "DiffSynth-Studio/Qwen-Image-Distill-Full:diffusion_pytorch_model*.safetensors,Qwen/Qwen-Image:text_encoder/model*.safetensors,Qwen/Qwen-Image:vae/diffusion_pytorch_model.safetensors" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Qwen-Image-Distill-Full_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "to_q,to_k,to_v,add_q_proj,add_k_proj,add_v_proj,to_out.0,to_add_out,img_mlp.net.2,img_mod.1,txt_mlp.net.2,txt_mod.1" \
  --lora_rank 32 \
  --use_gradient_checkpointing \
  --find_unused_parameters
