#!/usr/bin/env bash
# Wan2.2-Animate-14B: a full fine-tune of the Animate modules alone (--trainable_models animate_adapter: the
# reference's pipe.animate_adapter), DeepSpeed ZeRO-2 on 8 GPUs with the optimizer on the CPU
# (full/accelerate_config_14B.yaml). Run from the repository root.
#
# diffusers keeps the Animate modules inside WanAnimateTransformer3DModel (pipe.dit); "animate_adapter" names them
# there: pose_patch_embedding, motion_encoder, face_encoder and face_adapter. The main blocks stay frozen. Each epoch's
# weights of those modules are written under --output_path with the "pipe.animate_adapter." prefix removed
# (docs/en/Full_Fine_Tuning.md). The dataset is lora/Wan2.2-Animate-14B.sh's.
set -e

accelerate launch --config_file examples/wanvideo/model_training/full/accelerate_config_14B.yaml examples/wanvideo/model_training/train.py \
  --dataset_base_path data/diffsynth_example_dataset/wanvideo/Wan2.2-Animate-14B \
  --dataset_metadata_path data/diffsynth_example_dataset/wanvideo/Wan2.2-Animate-14B/metadata.csv \
  --data_file_keys "video,animate_pose_video,animate_face_video" \
  --height 480 \
  --width 832 \
  --num_frames 81 \
  --dataset_repeat 100 \
  --model_id_with_origin_paths "Wan-AI/Wan2.2-Animate-14B:diffusion_pytorch_model*.safetensors,Wan-AI/Wan2.2-Animate-14B:models_t5_umt5-xxl-enc-bf16.pth,Wan-AI/Wan2.2-Animate-14B:Wan2.1_VAE.pth,Wan-AI/Wan2.2-Animate-14B:models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth" \
  --learning_rate 1e-5 \
  --num_epochs 2 \
  --remove_prefix_in_ckpt "pipe.animate_adapter." \
  --output_path "./models/train/Wan2.2-Animate-14B_full" \
  --trainable_models "animate_adapter" \
  --extra_inputs "input_image,animate_pose_video,animate_face_video" \
  --use_gradient_checkpointing_offload
