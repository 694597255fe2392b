#!/usr/bin/env bash
# LoRA on the Qwen-Image-Edit-2511 transformer: image editing with several edit images per sample. Run from the
# repository root.
#
# The dataset is as for Qwen-Image-Edit-2509.sh (edit_image as a list in metadata.json, or comma-separated in a
# metadata.csv cell); to draw a small one:
#   python -m diffsynth.core.data.example_edit_dataset --output data/example_edit_pairs_dataset --num_edit_images 2
# --zero_cond_t modulates the edit images' tokens as at timestep 0, as 2511 was trained. The released 2511
# transformer's config.json already turns it on; the flag, kept from the reference command, makes sure.
set -e

accelerate launch examples/qwen_image/model_training/train.py \
  --dataset_base_path data/example_edit_pairs_dataset \
  --dataset_metadata_path data/example_edit_pairs_dataset/metadata.json \
  --data_file_keys "image,edit_image" \
  --extra_inputs "edit_image" \
  --max_pixels 1048576 \
  --dataset_repeat 50 \
  --model_id_with_origin_paths "Qwen/Qwen-Image-Edit-2511:transformer/diffusion_pytorch_model*.safetensors,Qwen/Qwen-Image:text_encoder/model*.safetensors,Qwen/Qwen-Image:vae/diffusion_pytorch_model.safetensors" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Qwen-Image-Edit-2511_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "to_q,to_k,to_v,add_q_proj,add_k_proj,add_v_proj,to_out.0,to_add_out,img_mlp.net.2,img_mod.1,txt_mlp.net.2,txt_mod.1" \
  --lora_rank 32 \
  --use_gradient_checkpointing \
  --dataset_num_workers 8 \
  --find_unused_parameters \
  --zero_cond_t # 2511 only: reference-image tokens modulated as at timestep 0
