#!/usr/bin/env bash
# Full fine-tunes of the two experts of Wan2.2-T2V-A14B, one run per expert (the reference's command: DeepSpeed ZeRO-2
# on 8 GPUs with the optimizer kept on the CPU, by full/accelerate_config_14B.yaml; full/accelerate_config_zero3.yaml
# also partitions the weights over the GPUs). Run from the repository root.
#
# The release switches from the high-noise expert (high_noise_model/) to the low-noise one (low_noise_model/) at
# timestep 875 of 1000, which is fraction 0.417 of the trainer's shifted grid: each run trains its expert on its share
# of the timesteps.
# The dataset is a folder of clips plus metadata.csv (columns video,prompt), each clip at least --num_frames frames
# long; to draw a small one:
#   python -m diffsynth.core.data.example_dataset --kind video --num_frames 49 --output data/example_video_dataset
# The model files (the original release files of Wan-AI/Wan2.2-T2V-A14B) are read from DIFFSYNTH_MODEL_BASE_PATH
# (default ./models) and downloaded there when missing.
# Each epoch's transformer is written under --output_path as epoch-<e>.safetensors and the diffusers folder
# epoch-<e>.dit/ (how to load them:
# docs/en/Full_Fine_Tuning.md). Gradient checkpointing is always on for Wan, as in the reference.
set -e

accelerate launch --config_file examples/wanvideo/model_training/full/accelerate_config_14B.yaml examples/wanvideo/model_training/train.py \
  --dataset_base_path data/example_video_dataset \
  --dataset_metadata_path data/example_video_dataset/metadata.csv \
  --height 480 \
  --width 832 \
  --num_frames 49 \
  --dataset_repeat 100 \
  --model_id_with_origin_paths "Wan-AI/Wan2.2-T2V-A14B:high_noise_model/diffusion_pytorch_model*.safetensors,Wan-AI/Wan2.2-T2V-A14B:models_t5_umt5-xxl-enc-bf16.pth,Wan-AI/Wan2.2-T2V-A14B:Wan2.1_VAE.pth" \
  --learning_rate 1e-5 \
  --num_epochs 2 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Wan2.2-T2V-A14B_high_noise_full" \
  --trainable_models "dit" \
  --max_timestep_boundary 0.417 \
  --min_timestep_boundary 0
# the high-noise expert: timesteps [875, 1000]

accelerate launch --config_file examples/wanvideo/model_training/full/accelerate_config_14B.yaml examples/wanvideo/model_training/train.py \
  --dataset_base_path data/example_video_dataset \
  --dataset_metadata_path data/example_video_dataset/metadata.csv \
  --height 480 \
  --width 832 \
  --num_frames 49 \
  --dataset_repeat 100 \
  --model_id_with_origin_paths "Wan-AI/Wan2.2-T2V-A14B:low_noise_model/diffusion_pytorch_model*.safetensors,Wan-AI/Wan2.2-T2V-A14B:models_t5_umt5-xxl-enc-bf16.pth,Wan-AI/Wan2.2-T2V-A14B:Wan2.1_VAE.pth" \
  --learning_rate 1e-5 \
  --num_epochs 2 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Wan2.2-T2V-A14B_low_noise_full" \
  --trainable_models "dit" \
  --max_timestep_boundary 1 \
  --min_timestep_boundary 0.417
# the low-noise expert: timesteps [0, 875)
