#!/usr/bin/env bash
# A full fine-tune of Wan2.1-T2V-14B on Ascend NPUs (the reference's command): full/Wan2.1-T2V-14B.sh's run with the NPU
# allocator settings, the reference's example dataset and --initialize_model_on_cpu (the 14B transformer is built in
# host memory, then DeepSpeed ZeRO-2 of full/accelerate_config_14B.yaml places it). It runs on GPUs too: the two
# exports only matter to torch_npu. --num_frames 81 is written out here (the reference leaves it to its default, 81).
#
# The dataset is a folder of clips plus metadata.csv (columns video,prompt). The reference downloads its example with
#   modelscope download --dataset DiffSynth-Studio/diffsynth_example_dataset --include "wanvideo/Wan2.1-T2V-14B/*" --local_dir ./data/diffsynth_example_dataset
# and a small drawn one takes its place with
#   python -m diffsynth.core.data.example_dataset --kind video --num_frames 81 --output data/diffsynth_example_dataset/wanvideo/Wan2.1-T2V-14B
# The model files are read from DIFFSYNTH_MODEL_BASE_PATH (default ./models) and downloaded there when missing. Each
# epoch's transformer is written as docs/en/Full_Fine_Tuning.md describes; validate_full/Wan2.1-T2V-14B.py renders it.
set -e

export PYTORCH_NPU_ALLOC_CONF=expandable_segments:True
export CPU_AFFINITY_CONF=1

accelerate launch --config_file examples/wanvideo/model_training/full/accelerate_config_14B.yaml examples/wanvideo/model_training/train.py \
  --dataset_base_path data/diffsynth_example_dataset/wanvideo/Wan2.1-T2V-14B \
  --dataset_metadata_path data/diffsynth_example_dataset/wanvideo/Wan2.1-T2V-14B/metadata.csv \
  --height 480 \
  --width 832 \
  --num_frames 81 \
  --dataset_repeat 100 \
  --model_id_with_origin_paths "Wan-AI/Wan2.1-T2V-14B:diffusion_pytorch_model*.safetensors,Wan-AI/Wan2.1-T2V-14B:models_t5_umt5-xxl-enc-bf16.pth,Wan-AI/Wan2.1-T2V-14B:Wan2.1_VAE.pth" \
  --learning_rate 1e-5 \
  --num_epochs 2 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Wan2.1-T2V-14B_full" \
  --trainable_models "dit" \
  --initialize_model_on_cpu
