#!/usr/bin/env bash
# LoRA on LTX-2's transformer from clips without sound (metadata.csv with the columns video,prompt), trained in two
# stages. Run from the repository root.
#
# The commands are the reference's (DiffSynth-Studio) with its flags, values and model files (LTX-2-Repackage's
# transformer, text connectors and VAE encoders, Gemma-3's release; see LTX-2-T2AV-splited.sh). The command reads no
# input_audio: the audio VAE encoder is loaded but has nothing to encode, the loss scores the video alone, while the
# transformer still runs its audio stream (zero latents noised to the drawn timestep). To try it on a small drawn
# dataset:
#   python -m diffsynth.core.data.example_dataset --kind video --num_frames 121 --output data/example_video_dataset
set -e

accelerate launch examples/ltx2/model_training/train.py \
  --dataset_base_path data/example_video_dataset \
  --dataset_metadata_path data/example_video_dataset/metadata.csv \
  --height 512 \
  --width 768 \
  --num_frames 121 \
  --dataset_repeat 1 \
  --model_id_with_origin_paths "DiffSynth-Studio/LTX-2-Repackage:text_encoder_post_modules.safetensors,DiffSynth-Studio/LTX-2-Repackage:video_vae_encoder.safetensors,DiffSynth-Studio/LTX-2-Repackage:audio_vae_encoder.safetensors,google/gemma-3-12b-it-qat-q4_0-unquantized:model-*.safetensors" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/LTX2-T2AV-noaudio_lora-splited-cache" \
  --lora_base_model "dit" \
  --lora_target_modules "to_k,to_q,to_v,to_out.0" \
  --lora_rank 32 \
  --use_gradient_checkpointing \
  --task "sft:data_process"

accelerate launch examples/ltx2/model_training/train.py \
  --dataset_base_path ./models/train/LTX2-T2AV-noaudio_lora-splited-cache \
  --height 512 \
  --width 768 \
  --num_frames 121 \
  --dataset_repeat 100 \
  --model_id_with_origin_paths "DiffSynth-Studio/LTX-2-Repackage:transformer.safetensors" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/LTX2-T2AV-noaudio_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "to_k,to_q,to_v,to_out.0" \
  --lora_rank 32 \
  --use_gradient_checkpointing \
  --task "sft:train"
