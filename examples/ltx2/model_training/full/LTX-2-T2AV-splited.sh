#!/usr/bin/env bash
# The whole LTX-2 audio+video transformer fine-tuned from clips with sound, in two stages. Run from the repository
# root.
#
# The commands are the reference's (DiffSynth-Studio) with its model files (see lora/LTX-2-T2AV-splited.sh for the
# files, the dataset and the stages). Stage 2 trains every weight of the transformer
# (--trainable_models dit) and writes it to --output_path as epoch-<e>.safetensors.
set -e

accelerate launch examples/ltx2/model_training/train.py \
  --dataset_base_path data/example_av_dataset \
  --dataset_metadata_path data/example_av_dataset/metadata.csv \
  --data_file_keys "video,input_audio" \
  --extra_inputs "input_audio" \
  --height 512 \
  --width 768 \
  --num_frames 121 \
  --dataset_repeat 1 \
  --model_id_with_origin_paths "DiffSynth-Studio/LTX-2-Repackage:text_encoder_post_modules.safetensors,DiffSynth-Studio/LTX-2-Repackage:video_vae_encoder.safetensors,DiffSynth-Studio/LTX-2-Repackage:audio_vae_encoder.safetensors,google/gemma-3-12b-it-qat-q4_0-unquantized:model-*.safetensors" \
  --learning_rate 1e-5 \
  --num_epochs 2 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/LTX2-T2AV_full-splited-cache" \
  --trainable_models "dit" \
  --use_gradient_checkpointing \
  --task "sft:data_process"

accelerate launch examples/ltx2/model_training/train.py \
  --dataset_base_path ./models/train/LTX2-T2AV_full-splited-cache \
  --data_file_keys "video,input_audio" \
  --extra_inputs "input_audio" \
  --height 512 \
  --width 768 \
  --num_frames 121 \
  --dataset_repeat 100 \
  --model_id_with_origin_paths "DiffSynth-Studio/LTX-2-Repackage:transformer.safetensors" \
  --learning_rate 1e-5 \
  --num_epochs 2 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/LTX2-T2AV_full" \
  --trainable_models "dit" \
  --use_gradient_checkpointing \
  --task "sft:train"
