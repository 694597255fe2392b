#!/usr/bin/env bash
# The whole JoyAI-Echo transformer (jd-opensource/JoyAI-Echo, an LTX-2.3 fine-tune released as one file) fine-tuned
# from clips with sound, in two stages. Run from the repository root.
#
# The commands are the reference's (DiffSynth-Studio) with its flags, values and model files (see
# lora/JoyAI-Echo-T2AV-splited.sh for the file, the dataset and the stages). Stage 2 trains every weight of the
# transformer (--trainable_models dit) under the reference's accelerate config (DeepSpeed ZeRO-2 with the optimizer on
# the CPU) and writes it to --output_path as epoch-<e>.safetensors. The dataset:
#   modelscope download --dataset DiffSynth-Studio/diffsynth_example_dataset --include "ltx2/LTX-2.3-T2AV-splited/*" --local_dir ./data/diffsynth_example_dataset
set -e

# Splited Training
accelerate launch examples/ltx2/model_training/train.py \
  --dataset_base_path data/diffsynth_example_dataset/ltx2/LTX-2.3-T2AV-splited \
  --dataset_metadata_path data/diffsynth_example_dataset/ltx2/LTX-2.3-T2AV-splited/metadata.csv \
  --data_file_keys "video,input_audio" \
  --extra_inputs "input_audio" \
  --height 512 \
  --width 768 \
  --num_frames 121 \
  --dataset_repeat 1 \
  --model_id_with_origin_paths "jd-opensource/JoyAI-Echo:JoyAI-Echo-release.safetensors,google/gemma-3-12b-it-qat-q4_0-unquantized:model-*.safetensors" \
  --learning_rate 1e-5 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/JoyAI-Echo-T2AV-full-splited-cache" \
  --trainable_models "dit" \
  --use_gradient_checkpointing \
  --task "sft:data_process"

accelerate launch --config_file examples/qwen_image/model_training/full/accelerate_config_zero2offload.yaml examples/ltx2/model_training/train.py \
  --dataset_base_path ./models/train/JoyAI-Echo-T2AV-full-splited-cache \
  --data_file_keys "video,input_audio" \
  --extra_inputs "input_audio" \
  --height 512 \
  --width 768 \
  --num_frames 121 \
  --dataset_repeat 100 \
  --model_id_with_origin_paths "jd-opensource/JoyAI-Echo:JoyAI-Echo-release.safetensors" \
  --learning_rate 1e-5 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/JoyAI-Echo-T2AV-full" \
  --trainable_models "dit" \
  --use_gradient_checkpointing \
  --task "sft:train"
