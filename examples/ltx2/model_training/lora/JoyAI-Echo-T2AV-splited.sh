#!/usr/bin/env bash
# LoRA on JoyAI-Echo (jd-opensource/JoyAI-Echo: a fine-tune of LTX-2.3 released as one file holding every component)
# from clips with sound, trained in two stages. Run from the repository root.
#
# The commands are the reference's (DiffSynth-Studio) with its flags, values and model files. The release file is
# named once: it gives the transformer, the text connectors, both VAEs and the vocoder (docs/en/LTX2.md, "One file
# holding every component"), of which training uses the first three. Stage 1
# (sft:data_process) loads it with Gemma-3 and caches each clip's prompt tokens (one width per stream), video and audio
# latents; stage 2 (sft:train) loads it alone and trains the transformer from the cache. The LoRA is written to
# --output_path as epoch-<e>.safetensors under LTX-2's own layer names.
#
# The dataset is the reference's LTX-2.3 example (metadata.csv with the columns video,prompt,input_audio):
#   modelscope download --dataset DiffSynth-Studio/diffsynth_example_dataset --include "ltx2/LTX-2.3-T2AV-splited/*" --local_dir ./data/diffsynth_example_dataset
# or, to try a small drawn one:
#   python -m diffsynth.core.data.example_dataset --kind video --audio --num_frames 121 \
#     --output data/diffsynth_example_dataset/ltx2/LTX-2.3-T2AV-splited
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
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/JoyAI-Echo-T2AV_lora-splited-cache" \
  --lora_base_model "dit" \
  --lora_target_modules "to_k,to_q,to_v,to_out.0" \
  --lora_rank 32 \
  --use_gradient_checkpointing \
  --task "sft:data_process"

accelerate launch examples/ltx2/model_training/train.py \
  --dataset_base_path ./models/train/JoyAI-Echo-T2AV_lora-splited-cache \
  --data_file_keys "video,input_audio" \
  --extra_inputs "input_audio" \
  --height 512 \
  --width 768 \
  --num_frames 121 \
  --dataset_repeat 100 \
  --model_id_with_origin_paths "jd-opensource/JoyAI-Echo:JoyAI-Echo-release.safetensors" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/JoyAI-Echo-T2AV_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "to_k,to_q,to_v,to_out.0" \
  --lora_rank 32 \
  --use_gradient_checkpointing \
  --task "sft:train"
