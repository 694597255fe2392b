#!/usr/bin/env bash
# LoRA on the Wan2.1 image-to-video transformer at 720P, as the reference trains it: on 8 GPUs (DeepSpeed ZeRO-2 by
# full/accelerate_config_14B.yaml), the checkpointed activations in CPU memory (--use_gradient_checkpointing_offload)
# and the models built on the CPU before they are placed (--initialize_model_on_cpu). Run from the repository root.
# The image condition is the input_image column, else each clip's first frame; the CLIP file is read as transformers'
# CLIPVisionModel (see lora/Wan2.1-I2V-14B-480P.sh).
# Make a dataset as for lora/Wan2.1-T2V-1.3B.sh (clips of at least --num_frames frames plus metadata.csv);
# --num_frames 49 is written out where the reference's command leaves the default (81).
set -e

accelerate launch --config_file examples/wanvideo/model_training/full/accelerate_config_14B.yaml examples/wanvideo/model_training/train.py \
  --dataset_base_path data/example_video_dataset \
  --dataset_metadata_path data/example_video_dataset/metadata.csv \
  --height 720 \
  --width 1280 \
  --num_frames 49 \
  --dataset_repeat 100 \
  --model_id_with_origin_paths "Wan-AI/Wan2.1-I2V-14B-720P:diffusion_pytorch_model*.safetensors,Wan-AI/Wan2.1-I2V-14B-720P:models_t5_umt5-xxl-enc-bf16.pth,Wan-AI/Wan2.1-I2V-14B-720P:Wan2.1_VAE.pth,Wan-AI/Wan2.1-I2V-14B-720P:models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Wan2.1-I2V-14B-720P_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "q,k,v,o,ffn.0,ffn.2" \
  --lora_rank 32 \
  --extra_inputs "input_image" \
  --use_gradient_checkpointing_offload \
  --initialize_model_on_cpu
