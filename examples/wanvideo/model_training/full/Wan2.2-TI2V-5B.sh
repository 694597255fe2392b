#!/usr/bin/env bash
# Full fine-tune of Wan2.2-TI2V-5B, text-image-to-video (the reference's command: a plain accelerate launch, one
# process per GPU of your default accelerate config; full/accelerate_config_14B.yaml or
# full/accelerate_config_zero3.yaml shard the optimizer state, or the weights too, over 8 GPUs). Run from the
# repository root.
#
# The dataset is a folder of clips plus metadata.csv (columns video,prompt), each clip at least --num_frames frames
# long; to draw a small one:
#   python -m diffsynth.core.data.example_dataset --kind video --num_frames 49 --output data/example_video_dataset
# The model works in the latent space of the Wan2.2 VAE (Wan2.2_VAE.pth: 16x spatial compression), so frame sizes are
# multiples of 32. With --extra_inputs input_image each sample's image (its input_image column, else its first frame)
# is encoded as the first latent frame, which the loss leaves out.
# The model files (the original release files of Wan-AI/Wan2.2-TI2V-5B) are read from DIFFSYNTH_MODEL_BASE_PATH
# (default ./models) and downloaded there when missing.
# Each epoch's transformer is written under --output_path as epoch-<e>.safetensors and the diffusers folder
# epoch-<e>.dit/ (how to load them:
# docs/en/Full_Fine_Tuning.md). Gradient checkpointing is always on for Wan, as in the reference.
set -e

accelerate launch examples/wanvideo/model_training/train.py \
  --dataset_base_path data/example_video_dataset \
  --dataset_metadata_path data/example_video_dataset/metadata.csv \
  --height 480 \
  --width 832 \
  --num_frames 49 \
  --dataset_repeat 100 \
  --model_id_with_origin_paths "Wan-AI/Wan2.2-TI2V-5B:diffusion_pytorch_model*.safetensors,Wan-AI/Wan2.2-TI2V-5B:models_t5_umt5-xxl-enc-bf16.pth,Wan-AI/Wan2.2-TI2V-5B:Wan2.2_VAE.pth" \
  --learning_rate 1e-5 \
  --num_epochs 2 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Wan2.2-TI2V-5B_full" \
  --trainable_models "dit" \
  --extra_inputs "input_image"
