#!/usr/bin/env bash
# Full fine-tune of the 14B Wan2.1 image-to-video transformer at 720P (the reference's command: DeepSpeed ZeRO-2 on 8
# GPUs with the optimizer kept on the CPU, by full/accelerate_config_14B.yaml; full/accelerate_config_zero3.yaml also
# partitions the weights over the GPUs). Run from the repository root.
#
# The dataset is a folder of clips plus metadata.csv (columns video,prompt), each clip at least --num_frames frames
# long; to draw a small one:
#   python -m diffsynth.core.data.example_dataset --kind video --num_frames 49 --output data/example_video_dataset
# --extra_inputs input_image conditions each sample on an image: the metadata's input_image column when it has one
# (add it to --data_file_keys), else the first frame of the clip. --use_gradient_checkpointing_offload keeps the
# checkpointed activations in CPU memory, which 720P clips need.
# The model files (the original release files of Wan-AI/Wan2.1-I2V-14B-720P) are read from DIFFSYNTH_MODEL_BASE_PATH
# (default ./models) and downloaded there when missing.
# Each epoch's transformer is written under --output_path as epoch-<e>.safetensors and the diffusers folder
# epoch-<e>.dit/ (how to load them:
# docs/en/Full_Fine_Tuning.md). Gradient checkpointing is always on for Wan, as in the reference.
set -e

accelerate launch --config_file examples/wanvideo/model_training/full/accelerate_config_14B.yaml examples/wanvideo/model_training/train.py \
  --dataset_base_path data/example_video_dataset \
  --dataset_metadata_path data/example_video_dataset/metadata.csv \
  --height 720 \
  --width 1280 \
  --num_frames 49 \
  --dataset_repeat 100 \
  --model_id_with_origin_paths "Wan-AI/Wan2.1-I2V-14B-720P:diffusion_pytorch_model*.safetensors,Wan-AI/Wan2.1-I2V-14B-720P:models_t5_umt5-xxl-enc-bf16.pth,Wan-AI/Wan2.1-I2V-14B-720P:Wan2.1_VAE.pth,Wan-AI/Wan2.1-I2V-14B-720P:models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth" \
  --learning_rate 1e-5 \
  --num_epochs 2 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Wan2.1-I2V-14B-720P_full" \
  --trainable_models "dit" \
  --extra_inputs "input_image" \
  --use_gradient_checkpointing_offload \
  --initialize_model_on_cpu
