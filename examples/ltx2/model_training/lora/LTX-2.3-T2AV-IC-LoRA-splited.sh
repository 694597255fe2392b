#!/usr/bin/env bash
# IC-LoRA (in-context control) on LTX-2.3's audio+video transformer, trained in two stages. Run from the
# repository root.
#
# The commands are the reference's (DiffSynth-Studio) with its flags, values and model files: the transformer, the
# text connectors (LTX-2.3's per-stream Gemma projections) and the two VAE encoders (each loads as its VAE without
# the decoder, which stage 1 never calls) come from DiffSynth-Studio/LTX-2.3-Repackage, Gemma-3 from Google's
# release.
#
# The metadata is a JSON list of rows such as
#   {"video": "clip.mp4", "prompt": "...", "input_audio": "clip.mp4", "in_context_videos": ["clip_depth.mp4"],
#    "in_context_downsample_factor": 2, "frame_rate": 24}
# with paths relative to --dataset_base_path (see lora/LTX-2-T2AV-IC-LoRA-splited.sh for what each key does).
# Stage 1 (sft:data_process) loads Gemma, the text connectors and both VAEs and caches each clip's prompt tokens (one
# set per stream), video, audio and reference latents; stage 2 (sft:train) loads the transformer alone and trains from
# the cache. The references are clean conditioning tokens: the loss is the clip's video error plus its sound's.
# At inference pass the same factor: pipe(prompt, in_context_videos=[frames], in_context_downsample_factor=2, ...).
set -e

accelerate launch examples/ltx2/model_training/train.py \
  --dataset_base_path data/diffsynth_example_dataset/ltx2/LTX-2.3-T2AV-IC-LoRA-splited \
  --dataset_metadata_path data/diffsynth_example_dataset/ltx2/LTX-2.3-T2AV-IC-LoRA-splited/metadata.json \
  --data_file_keys "video,input_audio,in_context_videos" \
  --extra_inputs "input_audio,in_context_videos,in_context_downsample_factor,frame_rate" \
  --height 512 \
  --width 768 \
  --num_frames 81 \
  --dataset_repeat 1 \
  --model_id_with_origin_paths "DiffSynth-Studio/LTX-2.3-Repackage:text_encoder_post_modules.safetensors,DiffSynth-Studio/LTX-2.3-Repackage:video_vae_encoder.safetensors,DiffSynth-Studio/LTX-2.3-Repackage:audio_vae_encoder.safetensors,google/gemma-3-12b-it-qat-q4_0-unquantized:model-*.safetensors" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/LTX2.3-T2AV-IC-LoRA-splited-cache" \
  --lora_base_model "dit" \
  --lora_target_modules "to_k,to_q,to_v,to_out.0" \
  --lora_rank 32 \
  --use_gradient_checkpointing \
  --task "sft:data_process"

accelerate launch examples/ltx2/model_training/train.py \
  --dataset_base_path ./models/train/LTX2.3-T2AV-IC-LoRA-splited-cache \
  --data_file_keys "video,input_audio,in_context_videos" \
  --extra_inputs "input_audio,in_context_videos,in_context_downsample_factor,frame_rate" \
  --height 512 \
  --width 768 \
  --num_frames 81 \
  --dataset_repeat 100 \
  --model_id_with_origin_paths "DiffSynth-Studio/LTX-2.3-Repackage:transformer.safetensors" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/LTX2.3-T2AV-IC-LoRA" \
  --lora_base_model "dit" \
  --lora_target_modules "to_k,to_q,to_v,to_out.0" \
  --lora_rank 32 \
  --use_gradient_checkpointing \
  --task "sft:train"
