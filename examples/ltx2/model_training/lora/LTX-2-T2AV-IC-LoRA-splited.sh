#!/usr/bin/env bash
# IC-LoRA (in-context control) on LTX-2's audio+video transformer, trained in two stages. Run from the repository root.
#
# The commands are the reference's (DiffSynth-Studio) with its flags, values and model files (LTX-2-Repackage's
# transformer, text connectors and VAE encoders, Gemma-3's release; see LTX-2-T2AV-splited.sh).
#
# The metadata is a JSON list of rows such as
#   {"video": "clip.mp4", "prompt": "...", "input_audio": "clip.mp4", "in_context_videos": ["clip_depth.mp4"],
#    "in_context_downsample_factor": 2, "frame_rate": 24}
# with paths relative to --dataset_base_path. in_context_videos names the reference video (or a list of them: depth,
# pose, edges...) the LoRA learns to follow; each is cut to the clip's frames and given at the clip's size divided by
# in_context_downsample_factor. Stage 1 (sft:data_process) loads Gemma, the text connectors and both VAEs and caches
# each clip's prompt, video, audio and reference latents; stage 2 (sft:train) loads the transformer alone and trains
# from the cache. The references are clean conditioning tokens: the loss is the clip's video error plus its sound's.
# At inference pass the same factor: pipe(prompt, in_context_videos=[frames], in_context_downsample_factor=2, ...).
set -e

accelerate launch examples/ltx2/model_training/train.py \
  --dataset_base_path data/example_video_dataset/ltx2 \
  --dataset_metadata_path data/example_video_dataset/ltx2_t2av_iclora.json \
  --data_file_keys "video,input_audio,in_context_videos" \
  --extra_inputs "input_audio,in_context_videos,in_context_downsample_factor,frame_rate" \
  --height 512 \
  --width 768 \
  --num_frames 81 \
  --dataset_repeat 1 \
  --model_id_with_origin_paths "DiffSynth-Studio/LTX-2-Repackage:text_encoder_post_modules.safetensors,DiffSynth-Studio/LTX-2-Repackage:video_vae_encoder.safetensors,DiffSynth-Studio/LTX-2-Repackage:audio_vae_encoder.safetensors,google/gemma-3-12b-it-qat-q4_0-unquantized:model-*.safetensors" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/LTX2-T2AV-IC-LoRA-splited-cache" \
  --lora_base_model "dit" \
  --lora_target_modules "to_k,to_q,to_v,to_out.0" \
  --lora_rank 32 \
  --use_gradient_checkpointing \
  --task "sft:data_process"

accelerate launch examples/ltx2/model_training/train.py \
  --dataset_base_path ./models/train/LTX2-T2AV-IC-LoRA-splited-cache \
  --data_file_keys "video,input_audio,in_context_videos" \
  --extra_inputs "input_audio,in_context_videos,in_context_downsample_factor,frame_rate" \
  --height 512 \
  --width 768 \
  --num_frames 81 \
  --dataset_repeat 100 \
  --model_id_with_origin_paths "DiffSynth-Studio/LTX-2-Repackage:transformer.safetensors" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/LTX2-T2AV-IC-LoRA" \
  --lora_base_model "dit" \
  --lora_target_modules "to_k,to_q,to_v,to_out.0" \
  --lora_rank 32 \
  --use_gradient_checkpointing \
  --task "sft:train"
