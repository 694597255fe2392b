#!/usr/bin/env bash
# The whole LTX-2.3 audio+video transformer fine-tuned from clips with sound, in two stages. Run from the
# repository root.
#
# The commands are the reference's (DiffSynth-Studio) with its flags, values and model files: the transformer, the
# text connectors (LTX-2.3's per-stream Gemma projections) and the two VAE encoders (each loads as its VAE without
# the decoder, which stage 1 never calls) come from DiffSynth-Studio/LTX-2.3-Repackage, Gemma-3 from Google's
# release.
#
# Stage 2 trains every weight of the transformer (--trainable_models dit) under the reference's accelerate config
# (DeepSpeed ZeRO-2 with the optimizer on the CPU, 8 GPUs; change num_processes there for another count) and writes it
# to --output_path as epoch-<e>.safetensors. See lora/LTX-2.3-T2AV-splited.sh for the dataset and the stages.
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
  --learning_rate 1e-5 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/LTX2.3-T2AV-full-splited-cache" \
  --trainable_models "dit" \
  --use_gradient_checkpointing \
  --task "sft:data_process"

accelerate launch --config_file examples/qwen_image/model_training/full/accelerate_config_zero2offload.yaml examples/ltx2/model_training/train.py \
  --dataset_base_path ./models/train/LTX2.3-T2AV-full-splited-cache \
  --data_file_keys "video,input_audio" \
  --extra_inputs "input_audio" \
  --height 512 \
  --width 768 \
  --num_frames 121 \
  --dataset_repeat 100 \
  --model_id_with_origin_paths "DiffSynth-Studio/LTX-2.3-Repackage:transformer.safetensors" \
  --learning_rate 1e-5 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/LTX2.3-T2AV-full" \
  --trainable_models "dit" \
  --use_gradient_checkpointing \
  --task "sft:train"
