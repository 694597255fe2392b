#!/usr/bin/env bash
# LoRA on Wan2.1-T2V-1.3B in two stages. Run from the repository root.
#
# Stage 1 decodes every clip, encodes its frames with the VAE and its prompt with the UMT5 text encoder once, and
# caches the results in ./models/train/Wan2.1-T2V-1.3B_lora_cache. The transformer is never run there, so it is built
# without weights. The frame size and count are fixed here (--height, --width, --num_frames): the cache holds latents
# of that shape, so stage 2 needs no size flags, and other sizes need a new stage 1 into a fresh folder.
# Stage 2 trains from the cache; the text encoder and the VAE are never run there, so they are built without weights,
# and no video is decoded. Given the same --seed, stage 2 draws the same samples, timesteps and noise as
# ../../lora/Wan2.1-T2V-1.3B.sh, so it trains the same LoRA.
# Stage 1 can be rerun as it is (after an interruption or an edit to the dataset): it keeps the samples whose
# fingerprint still matches, recomputes the others and removes those of deleted rows.
set -e

accelerate launch examples/wanvideo/model_training/train.py \
  --dataset_base_path data/example_video_dataset \
  --dataset_metadata_path data/example_video_dataset/metadata.csv \
  --height 480 \
  --width 832 \
  --num_frames 49 \
  --dataset_repeat 1 \
  --model_id_with_origin_paths "Wan-AI/Wan2.1-T2V-1.3B:diffusion_pytorch_model*.safetensors,Wan-AI/Wan2.1-T2V-1.3B:models_t5_umt5-xxl-enc-bf16.pth,Wan-AI/Wan2.1-T2V-1.3B:Wan2.1_VAE.pth" \
  --offload_models "Wan-AI/Wan2.1-T2V-1.3B:diffusion_pytorch_model*.safetensors" \
  --output_path "./models/train/Wan2.1-T2V-1.3B_lora_cache" \
  --lora_base_model "dit" \
  --lora_target_modules "q,k,v,o,ffn.0,ffn.2" \
  --lora_rank 32 \
  --dataset_num_workers 8 \
  --task "sft:data_process"

accelerate launch examples/wanvideo/model_training/train.py \
  --dataset_base_path "./models/train/Wan2.1-T2V-1.3B_lora_cache" \
  --dataset_repeat 100 \
  --model_id_with_origin_paths "Wan-AI/Wan2.1-T2V-1.3B:diffusion_pytorch_model*.safetensors,Wan-AI/Wan2.1-T2V-1.3B:models_t5_umt5-xxl-enc-bf16.pth,Wan-AI/Wan2.1-T2V-1.3B:Wan2.1_VAE.pth" \
  --offload_models "Wan-AI/Wan2.1-T2V-1.3B:models_t5_umt5-xxl-enc-bf16.pth,Wan-AI/Wan2.1-T2V-1.3B:Wan2.1_VAE.pth" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Wan2.1-T2V-1.3B_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "q,k,v,o,ffn.0,ffn.2" \
  --lora_rank 32 \
  --use_gradient_checkpointing \
  --dataset_num_workers 8 \
  --task "sft:train"
