#!/usr/bin/env bash
# LoRA on the Z-Image-Omni-Base transformer, trained in one stage: the reference's command. Run from the repository
# root. Omni-Base also reads condition images through its SigLIP2 encoder (siglip/); the commented command below
# trains with them (the edit_image column).
#
# The dataset is a folder of images plus metadata.csv (columns image,prompt). To try the command on a small
# procedurally drawn one:  python -m diffsynth.core.data.example_dataset --output data/example_image_dataset
# With condition images:  python -m diffsynth.core.data.example_edit_dataset --output data/example_edit_dataset
# The model files are read from DIFFSYNTH_MODEL_BASE_PATH (default ./models) and downloaded there when missing; the
# reference loads Z-Image-Turbo's text encoder and VAE beside the Omni-Base transformer and SigLIP2.
# The LoRA is written to the --output_path as epoch-<e>.safetensors (loads in ComfyUI, diffusers,
# DiffSynth-Studio at strength 1.0; docs/en/Using_LoRA.md).
set -e

# Text to image training
accelerate launch examples/z_image/model_training/train.py \
  --dataset_base_path data/example_image_dataset \
  --dataset_metadata_path data/example_image_dataset/metadata.csv \
  --max_pixels 1048576 \
  --dataset_repeat 50 \
  --model_id_with_origin_paths "Tongyi-MAI/Z-Image-Omni-Base:transformer/*.safetensors,Tongyi-MAI/Z-Image-Omni-Base:siglip/model.safetensors,Tongyi-MAI/Z-Image-Turbo:text_encoder/*.safetensors,Tongyi-MAI/Z-Image-Turbo:vae/diffusion_pytorch_model.safetensors" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Z-Image-Omni-Base_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "to_q,to_k,to_v,to_out.0,w1,w2,w3" \
  --lora_rank 32 \
  --use_gradient_checkpointing \
  --find_unused_parameters \
  --dataset_num_workers 8

# Image(s) to image training
# accelerate launch examples/z_image/model_training/train.py \
#   --dataset_base_path data/example_edit_dataset \
#   --dataset_metadata_path data/example_edit_dataset/metadata.json \
#   --data_file_keys "image,edit_image" \
#   --extra_inputs "edit_image" \
#   --max_pixels 1048576 \
#   --dataset_repeat 50 \
#   --model_id_with_origin_paths "Tongyi-MAI/Z-Image-Omni-Base:transformer/*.safetensors,Tongyi-MAI/Z-Image-Omni-Base:siglip/model.safetensors,Tongyi-MAI/Z-Image-Turbo:text_encoder/*.safetensors,Tongyi-MAI/Z-Image-Turbo:vae/diffusion_pytorch_model.safetensors" \
#   --learning_rate 1e-4 \
#   --num_epochs 5 \
#   --remove_prefix_in_ckpt "pipe.dit." \
#   --output_path "./models/train/Z-Image-Omni-Base_lora_edit" \
#   --lora_base_model "dit" \
#   --lora_target_modules "to_q,to_k,to_v,to_out.0,w1,w2,w3" \
#   --lora_rank 32 \
#   --use_gradient_checkpointing \
#   --find_unused_parameters \
#   --dataset_num_workers 8
