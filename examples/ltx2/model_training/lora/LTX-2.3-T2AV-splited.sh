#!/usr/bin/env bash
# LoRA on LTX-2.3's audio+video transformer from clips with sound, trained in two stages. Run from the repository
# root.
#
# The commands are the reference's (DiffSynth-Studio) with its flags, values and model files: the transformer, the
# text connectors (LTX-2.3's per-stream Gemma projections) and the two VAE encoders (each loads as its VAE without
# the decoder, which stage 1 never calls) come from DiffSynth-Studio/LTX-2.3-Repackage, Gemma-3 from Google's
# release.
#
# The dataset: a folder of clips plus metadata.csv with the columns video,prompt,input_audio (input_audio names a sound
# file or a video whose sound track is used, often the clip itself). The reference downloads its example with
#   modelscope download --dataset DiffSynth-Studio/diffsynth_example_dataset --include "ltx2/LTX-2.3-T2AV-splited/*" --local_dir ./data/diffsynth_example_dataset
# and a small drawn one takes its place with
#   python -m diffsynth.core.data.example_dataset --kind video --audio --num_frames 121 --output data/diffsynth_example_dataset/ltx2/LTX-2.3-T2AV-splited
# Stage 1 (sft:data_process) loads Gemma, the text connectors and both VAEs and caches each clip's prompt tokens (one
# set per stream), video and audio latents; stage 2 (sft:train) loads the transformer alone and trains from
# the cache. The loss is the video's mean squared error plus the sound's.
# The LoRA is written to --output_path as epoch-<e>.safetensors under LTX-2's own layer names (it loads in
# ComfyUI and in diffusers' LTX2Pipeline with LTX-2.3).
set -e

accelerate launch examples/ltx2/model_training/train.py \
  --dataset_base_path data/diffsynth_example_dataset/ltx2/LTX-2.3-T2AV-splited \
  --dataset_metadata_path data/diffsynth_example_dataset/ltx2/LTX-2.3-T2AV-splited/metadata.csv \
  --data_file_keys "video,input_audio" \
  --extra_inputs "input_audio" \
  --height 512 \
  --width 768 \
  --num_frames 121 \
  --dataset_repeat 1 \
  --model_id_with_origin_paths "DiffSynth-Studio/LTX-2.3-Repackage:text_encoder_post_modules.safetensors,DiffSynth-Studio/LTX-2.3-Repackage:video_vae_encoder.safetensors,DiffSynth-Studio/LTX-2.3-Repackage:audio_vae_encoder.safetensors,google/gemma-3-12b-it-qat-q4_0-unquantized:model-*.safetensors" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/LTX2.3-T2AV_lora-splited-cache" \
  --lora_base_model "dit" \
  --lora_target_modules "to_k,to_q,to_v,to_out.0" \
  --lora_rank 32 \
  --use_gradient_checkpointing \
  --task "sft:data_process"

accelerate launch examples/ltx2/model_training/train.py \
  --dataset_base_path ./models/train/LTX2.3-T2AV_lora-splited-cache \
  --data_file_keys "video,input_audio" \
  --extra_inputs "input_audio" \
  --height 512 \
  --width 768 \
  --num_frames 121 \
  --dataset_repeat 100 \
  --model_id_with_origin_paths "DiffSynth-Studio/LTX-2.3-Repackage:transformer.safetensors" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/LTX2.3-T2AV_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "to_k,to_q,to_v,to_out.0" \
  --lora_rank 32 \
  --use_gradient_checkpointing \
  --task "sft:train"
