#!/usr/bin/env bash
# Wan VACE: a LoRA on the VACE blocks (--lora_base_model vace: the reference's pipe.vace)
# of PAI/Wan2.2-VACE-Fun-A14B, as the reference (DiffSynth-Studio) trains it. Run from the repository root.
# Two runs, one per expert (high_noise_model/, low_noise_model/), each on its share of the timesteps.
#
# The release's original files (a VaceWanModel config.json and shards, the UMT5 encoder and the VAE as .pth files) load
# into diffusers' WanVACETransformer3DModel, UMT5EncoderModel and AutoencoderKLWan; the transformer is pipe.dit and its
# VACE blocks are what "vace" names. The model files are read from DIFFSYNTH_MODEL_BASE_PATH (default ./models) and
# downloaded there when missing.
#
# The dataset: metadata.csv with the columns video,prompt,vace_video,vace_reference_image (a vace_video_mask column
# too, if you have masks: add it to --data_file_keys and --extra_inputs). The reference downloads its example with
#   modelscope download --dataset DiffSynth-Studio/diffsynth_example_dataset --include "wanvideo/Wan2.2-VACE-Fun-A14B/*" --local_dir ./data/diffsynth_example_dataset
# or draw a small one at the same place:
#   python -m diffsynth.pipelines.wan_video.example_vace --num_frames 49 --output data/diffsynth_example_dataset/wanvideo/Wan2.2-VACE-Fun-A14B
# Gradient checkpointing is always on for Wan, as in the reference. The LoRA is written to --output_path as
# epoch-<e>.safetensors under the original Wan names (vace_blocks.<i>.self_attn.q, ...: ComfyUI and DiffSynth-Studio)
# with a diffusers-named twin epoch-<e>.diffusers.safetensors for diffusers' WanVACEPipeline (docs/en/Using_LoRA.md).
# Samples while training take the control inputs too: a --validation_prompts JSON file whose entries name vace_video,
# vace_video_mask and vace_reference_image (docs/en/Wan_Control.md).
set -e

accelerate launch examples/wanvideo/model_training/train.py \
  --dataset_base_path data/diffsynth_example_dataset/wanvideo/Wan2.2-VACE-Fun-A14B \
  --dataset_metadata_path data/diffsynth_example_dataset/wanvideo/Wan2.2-VACE-Fun-A14B/metadata.csv \
  --data_file_keys "video,vace_video,vace_reference_image" \
  --height 480 \
  --width 832 \
  --num_frames 17 \
  --dataset_repeat 100 \
  --model_id_with_origin_paths "PAI/Wan2.2-VACE-Fun-A14B:high_noise_model/diffusion_pytorch_model*.safetensors,PAI/Wan2.2-VACE-Fun-A14B:models_t5_umt5-xxl-enc-bf16.pth,PAI/Wan2.2-VACE-Fun-A14B:Wan2.1_VAE.pth" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.vace." \
  --output_path "./models/train/Wan2.2-VACE-Fun-A14B_high_noise_lora" \
  --lora_base_model "vace" \
  --lora_target_modules "q,k,v,o,ffn.0,ffn.2" \
  --lora_rank 32 \
  --extra_inputs "vace_video,vace_reference_image" \
  --use_gradient_checkpointing_offload \
  --max_timestep_boundary 0.358 \
  --min_timestep_boundary 0
# boundary corresponds to timesteps [900, 1000]

accelerate launch examples/wanvideo/model_training/train.py \
  --dataset_base_path data/diffsynth_example_dataset/wanvideo/Wan2.2-VACE-Fun-A14B \
  --dataset_metadata_path data/diffsynth_example_dataset/wanvideo/Wan2.2-VACE-Fun-A14B/metadata.csv \
  --data_file_keys "video,vace_video,vace_reference_image" \
  --height 480 \
  --width 832 \
  --num_frames 17 \
  --dataset_repeat 100 \
  --model_id_with_origin_paths "PAI/Wan2.2-VACE-Fun-A14B:low_noise_model/diffusion_pytorch_model*.safetensors,PAI/Wan2.2-VACE-Fun-A14B:models_t5_umt5-xxl-enc-bf16.pth,PAI/Wan2.2-VACE-Fun-A14B:Wan2.1_VAE.pth" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.vace." \
  --output_path "./models/train/Wan2.2-VACE-Fun-A14B_low_noise_lora" \
  --lora_base_model "vace" \
  --lora_target_modules "q,k,v,o,ffn.0,ffn.2" \
  --lora_rank 32 \
  --extra_inputs "vace_video,vace_reference_image" \
  --use_gradient_checkpointing_offload \
  --max_timestep_boundary 1 \
  --min_timestep_boundary 0.358
# boundary corresponds to timesteps [0, 900]
