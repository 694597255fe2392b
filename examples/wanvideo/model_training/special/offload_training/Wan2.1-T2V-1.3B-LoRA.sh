#!/usr/bin/env bash
# LoRA on Wan2.1-T2V-1.3B for a small GPU: the weights of all three models stay in CPU memory and each layer is copied
# to the GPU only while it computes, so the GPU holds one layer's weights plus the activations of a 49-frame clip.
# Expect 2-10x slower steps than ../../lora/Wan2.1-T2V-1.3B.sh, and enough host memory for the models in bfloat16
# (the UMT5 text encoder is the largest; plan on about 16 GB). Run from the repository root.
#
# One process as written (--num_processes 1 whatever the accelerate config says); offload also trains on several
# GPUs, which share one host copy of the frozen weights (docs/en/Multi_GPU.md).
# Fewer frames (--num_frames 33, 17) or a smaller --height/--width shrink the activations, the part offload leaves.
#
# Two more flags belong to this mode:
#   --enable_optimizer_cpu_offload   also keeps the trainable weights, their gradients and the AdamW state on the
#                                    CPU (the optimizer steps there); meant for a full fine-tune (--trainable_models
#                                    dit), a LoRA does not need it.
#   --cpu_offload_split_threshold MB experimental: modules up to this size move as one piece, fewer and larger
#                                    copies for more VRAM; unset moves one leaf layer at a time.
set -e

accelerate launch --num_processes 1 examples/wanvideo/model_training/train.py \
  --dataset_base_path data/example_video_dataset \
  --dataset_metadata_path data/example_video_dataset/metadata.csv \
  --height 480 \
  --width 832 \
  --num_frames 49 \
  --dataset_repeat 100 \
  --model_id_with_origin_paths "Wan-AI/Wan2.1-T2V-1.3B:diffusion_pytorch_model*.safetensors,Wan-AI/Wan2.1-T2V-1.3B:models_t5_umt5-xxl-enc-bf16.pth,Wan-AI/Wan2.1-T2V-1.3B:Wan2.1_VAE.pth" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Wan2.1-T2V-1.3B_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "q,k,v,o,ffn.0,ffn.2" \
  --lora_rank 32 \
  --use_gradient_checkpointing \
  --dataset_num_workers 8 \
  --enable_model_cpu_offload
