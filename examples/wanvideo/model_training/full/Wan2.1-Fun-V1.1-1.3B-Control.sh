#!/usr/bin/env bash
# Full fine-tune of PAI/Wan2.1-Fun-V1.1-1.3B-Control (the reference's command). Run from the repository root. The
# dataset's metadata.csv has the columns video, prompt, control_video (a control clip: depth, edges, pose... as long
# as the video) and reference_image (an image file whose look the video takes). No first frame is given: the image
# condition is zeros, as in the reference. See docs/en/Wan_Control.md for the dataset layout and inference.
# --num_frames 81 is the reference's default, which its command leaves implicit.
set -e

accelerate launch examples/wanvideo/model_training/train.py \
  --dataset_base_path data/diffsynth_example_dataset/wanvideo/Wan2.1-Fun-V1.1-1.3B-Control \
  --dataset_metadata_path data/diffsynth_example_dataset/wanvideo/Wan2.1-Fun-V1.1-1.3B-Control/metadata.csv \
  --data_file_keys "video,control_video,reference_image" \
  --height 480 \
  --width 832 \
  --num_frames 81 \
  --dataset_repeat 100 \
  --model_id_with_origin_paths "PAI/Wan2.1-Fun-V1.1-1.3B-Control:diffusion_pytorch_model*.safetensors,PAI/Wan2.1-Fun-V1.1-1.3B-Control:models_t5_umt5-xxl-enc-bf16.pth,PAI/Wan2.1-Fun-V1.1-1.3B-Control:Wan2.1_VAE.pth,PAI/Wan2.1-Fun-V1.1-1.3B-Control:models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth" \
  --learning_rate 1e-5 \
  --num_epochs 2 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Wan2.1-Fun-V1.1-1.3B-Control_full" \
  --trainable_models "dit" \
  --extra_inputs "control_video,reference_image"
