#!/usr/bin/env bash
# Direct distillation of Wan2.1-T2V-1.3B into a few-step sampler (a full fine-tune, on 8 GPUs by
# full/accelerate_config_14B.yaml, as the reference runs it). Run from the repository root.
#
# The dataset holds clips the base model generated with many steps, and per clip how the distilled sampler should
# reproduce it: metadata.csv with the columns video,prompt,seed,rand_device,num_inference_steps,cfg_scale, e.g.
#   video_000.mp4,"a red cat",0,cpu,4,1
# --task direct_distill runs the whole num_inference_steps loop from the seed's noise (drawn on rand_device, as
# inference draws it), guided by cfg_scale when it is not 1, and matches the clip's latents (docs/en/Training.md). Keep
# --height, --width and --num_frames at the clips' own, and sample with the result at the steps and cfg_scale it was
# distilled for.
set -e

accelerate launch --config_file examples/wanvideo/model_training/full/accelerate_config_14B.yaml examples/wanvideo/model_training/train.py \
  --dataset_base_path data/example_distill_video_dataset \
  --dataset_metadata_path data/example_distill_video_dataset/metadata.csv \
  --height 480 \
  --width 832 \
  --num_frames 49 \
  --dataset_repeat 160 \
  --model_id_with_origin_paths "Wan-AI/Wan2.1-T2V-1.3B:diffusion_pytorch_model*.safetensors,Wan-AI/Wan2.1-T2V-1.3B:models_t5_umt5-xxl-enc-bf16.pth,Wan-AI/Wan2.1-T2V-1.3B:Wan2.1_VAE.pth" \
  --learning_rate 1e-5 \
  --num_epochs 2 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Wan2.1-T2V-1.3B_full_distill" \
  --trainable_models "dit" \
  --task "direct_distill" \
  --extra_inputs "seed,rand_device,num_inference_steps,cfg_scale"
