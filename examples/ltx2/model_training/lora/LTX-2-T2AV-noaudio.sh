#!/usr/bin/env bash
# LoRA on LTX-2's transformer from clips without sound (metadata.csv with the columns video,prompt), in one stage.
# Run from the repository root.
#
# The command is the reference's single-stage one (DiffSynth-Studio) with its model files but the video VAE's, from
# the diffusers folder of Lightricks/LTX-2 (see LTX-2-T2AV-splited.sh). No audio VAE is loaded: the loss scores the
# video alone, while the transformer still runs its audio stream (zero latents noised to the drawn timestep). To try
# it on a small drawn dataset:
#   python -m diffsynth.core.data.example_dataset --kind video --num_frames 121 --output data/example_video_dataset
set -e

accelerate launch examples/ltx2/model_training/train.py \
  --dataset_base_path data/example_video_dataset \
  --dataset_metadata_path data/example_video_dataset/metadata.csv \
  --height 512 \
  --width 768 \
  --num_frames 121 \
  --dataset_repeat 100 \
  --model_id_with_origin_paths "DiffSynth-Studio/LTX-2-Repackage:transformer.safetensors,DiffSynth-Studio/LTX-2-Repackage:text_encoder_post_modules.safetensors,Lightricks/LTX-2:vae/diffusion_pytorch_model.safetensors,google/gemma-3-12b-it-qat-q4_0-unquantized:model-*.safetensors" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/LTX2-T2AV-noaudio_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "to_k,to_q,to_v,to_out.0" \
  --lora_rank 32 \
  --use_gradient_checkpointing
