#!/usr/bin/env bash
# Wan2.2-Animate-14B: a LoRA on the transformer's blocks, as the reference (DiffSynth-Studio) trains it; the reference
# ran it on 8 80 GB GPUs (full/accelerate_config_14B.yaml). Run from the repository root.
#
# The release's original files (config.json and shards, the UMT5 encoder, the VAE and the CLIP encoder as .pth files)
# load into diffusers' WanAnimateTransformer3DModel (pipe.dit, its pose embedding, motion and face encoders and face
# adapter included), UMT5EncoderModel, AutoencoderKLWan and CLIPVisionModel. The model files are read from
# DIFFSYNTH_MODEL_BASE_PATH (default ./models) and downloaded there when missing.
#
# The dataset: metadata.csv with the columns video,prompt,animate_pose_video,animate_face_video (replacement mode adds
# animate_inpaint_video,animate_mask_video: put them in --data_file_keys and --extra_inputs). input_image, the
# character, is each clip's first frame unless the metadata has an input_image column. The control videos give their
# first num_frames - 4 frames, as the reference cuts them. The reference downloads its example with
#   modelscope download --dataset DiffSynth-Studio/diffsynth_example_dataset --include "wanvideo/Wan2.2-Animate-14B/*" --local_dir ./data/diffsynth_example_dataset
# or draw a small one at the same place:
#   python -m diffsynth.pipelines.wan_video.example_animate --num_frames 81 --output data/diffsynth_example_dataset/wanvideo/Wan2.2-Animate-14B
# The LoRA is written to --output_path as epoch-<e>.safetensors under the original Wan names (blocks.<i>.self_attn.q,
# ...: ComfyUI and DiffSynth-Studio), which diffusers' WanAnimatePipeline.load_lora_weights reads as it is.
# Samples while training take the Animate inputs: a --validation_prompts JSON file whose entries name input_image,
# animate_pose_video and animate_face_video (docs/en/Wan_Control.md).
set -e

accelerate launch --config_file examples/wanvideo/model_training/full/accelerate_config_14B.yaml examples/wanvideo/model_training/train.py \
  --dataset_base_path data/diffsynth_example_dataset/wanvideo/Wan2.2-Animate-14B \
  --dataset_metadata_path data/diffsynth_example_dataset/wanvideo/Wan2.2-Animate-14B/metadata.csv \
  --data_file_keys "video,animate_pose_video,animate_face_video" \
  --height 480 \
  --width 832 \
  --num_frames 81 \
  --dataset_repeat 100 \
  --model_id_with_origin_paths "Wan-AI/Wan2.2-Animate-14B:diffusion_pytorch_model*.safetensors,Wan-AI/Wan2.2-Animate-14B:models_t5_umt5-xxl-enc-bf16.pth,Wan-AI/Wan2.2-Animate-14B:Wan2.1_VAE.pth,Wan-AI/Wan2.2-Animate-14B:models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Wan2.2-Animate-14B_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "q,k,v,o,ffn.0,ffn.2" \
  --lora_rank 32 \
  --extra_inputs "input_image,animate_pose_video,animate_face_video" \
  --use_gradient_checkpointing_offload
