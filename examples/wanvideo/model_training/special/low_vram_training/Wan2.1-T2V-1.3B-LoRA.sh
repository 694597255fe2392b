#!/usr/bin/env bash
# LoRA on Wan2.1-T2V-1.3B with split training and DeepSpeed ZeRO-3 (weights and optimizer states in CPU memory).
# Run from the repository root; needs DeepSpeed (pip install -c constraints.txt deepspeed --no-build-isolation).
# Stage 1 caches the UMT5 prompt embeddings and the VAE latents of every clip; stage 2 loads only the transformer on
# the CPU and lets ZeRO-3 partition it under deepspeed_zero3_cpuoffload.yaml (this folder; set num_processes to the
# number of GPUs). See ../../../../qwen_image/model_training/special/low_vram_training/ for notes.
set -e

accelerate launch examples/wanvideo/model_training/train.py \
  --dataset_base_path data/example_video_dataset \
  --dataset_metadata_path data/example_video_dataset/metadata.csv \
  --height 480 \
  --width 832 \
  --num_frames 49 \
  --dataset_repeat 1 \
  --model_id_with_origin_paths "Wan-AI/Wan2.1-T2V-1.3B:models_t5_umt5-xxl-enc-bf16.pth,Wan-AI/Wan2.1-T2V-1.3B:Wan2.1_VAE.pth" \
  --output_path "./models/train/Wan2.1-T2V-1.3B_lora_cache" \
  --lora_base_model "dit" \
  --lora_target_modules "q,k,v,o,ffn.0,ffn.2" \
  --lora_rank 32 \
  --task "sft:data_process"

accelerate launch --config_file examples/wanvideo/model_training/special/low_vram_training/deepspeed_zero3_cpuoffload.yaml \
  examples/wanvideo/model_training/train.py \
  --dataset_base_path "./models/train/Wan2.1-T2V-1.3B_lora_cache" \
  --num_frames 49 \
  --dataset_repeat 100 \
  --model_id_with_origin_paths "Wan-AI/Wan2.1-T2V-1.3B:diffusion_pytorch_model*.safetensors" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Wan2.1-T2V-1.3B_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "q,k,v,o,ffn.0,ffn.2" \
  --lora_rank 32 \
  --mixed_precision bf16 \
  --use_gradient_checkpointing \
  --initialize_model_on_cpu \
  --task "sft:train"
