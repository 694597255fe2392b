#!/usr/bin/env bash
# LoRA on Qwen-Image for a GPU that cannot hold the transformer: the weights stay in CPU memory and each layer is
# copied to the GPU only while it computes. Expect 2-10x slower steps than ../../lora/Qwen-Image.sh, and enough
# host memory for the models (plan on about 64 GB for Qwen-Image in bfloat16). Run from the repository root.
#
# One process as written (--num_processes 1 whatever the accelerate config says); offload also trains on several
# GPUs, which share one host copy of the frozen weights (docs/en/Multi_GPU.md).
#
# Two more flags belong to this mode:
#   --enable_optimizer_cpu_offload   also keeps the trainable weights, their gradients and the AdamW state on the
#                                    CPU (the optimizer steps there). A LoRA is small enough not to need it; use it
#                                    for a full fine-tune (--trainable_models dit) that does not fit otherwise.
#   --cpu_offload_split_threshold MB experimental: modules up to this size move as one piece, fewer and larger
#                                    copies for more VRAM; unset moves one leaf layer at a time.
set -e

accelerate launch --num_processes 1 examples/qwen_image/model_training/train.py \
  --dataset_base_path data/example_image_dataset \
  --dataset_metadata_path data/example_image_dataset/metadata.csv \
  --max_pixels 1048576 \
  --dataset_repeat 50 \
  --model_id_with_origin_paths "Qwen/Qwen-Image:transformer/diffusion_pytorch_model*.safetensors,Qwen/Qwen-Image:text_encoder/model*.safetensors,Qwen/Qwen-Image:vae/diffusion_pytorch_model.safetensors" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Qwen-Image_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "to_q,to_k,to_v,add_q_proj,add_k_proj,add_v_proj,to_out.0,to_add_out,img_mlp.net.2,img_mod.1,txt_mlp.net.2,txt_mod.1" \
  --lora_rank 32 \
  --use_gradient_checkpointing \
  --dataset_num_workers 8 \
  --find_unused_parameters \
  --enable_model_cpu_offload
