#!/usr/bin/env bash
# LoRA on the Z-Image-Turbo transformer with the 8-step Union ControlNet in place, trained in one
# stage: the reference's command. Run from the repository root. The ControlNet stays frozen; the
# LoRA learns with its hints, and is used with the same ControlNet (docs/en/Z_Image.md).
#
# The dataset is a folder of images plus metadata.csv (columns image,controlnet_image,prompt: the target
# and its control image). To try the command on a small procedurally drawn one:
#  python -m diffsynth.core.data.example_edit_dataset --output data/example_controlnet_dataset --column controlnet_image
# The model files are read from DIFFSYNTH_MODEL_BASE_PATH (default ./models) and downloaded there when missing.
# The LoRA is written to the --output_path as epoch-<e>.safetensors (loads in ComfyUI, diffusers,
# DiffSynth-Studio at strength 1.0; docs/en/Using_LoRA.md).
set -e

accelerate launch examples/z_image/model_training/train.py \
  --dataset_base_path data/example_controlnet_dataset \
  --dataset_metadata_path data/example_controlnet_dataset/metadata.csv \
  --data_file_keys "image,controlnet_image" \
  --max_pixels 1048576 \
  --dataset_repeat 100 \
  --model_id_with_origin_paths "PAI/Z-Image-Turbo-Fun-Controlnet-Union-2.1:Z-Image-Turbo-Fun-Controlnet-Union-2.1-8steps.safetensors,Tongyi-MAI/Z-Image-Turbo:transformer/*.safetensors,Tongyi-MAI/Z-Image-Turbo:text_encoder/*.safetensors,Tongyi-MAI/Z-Image-Turbo:vae/diffusion_pytorch_model.safetensors" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Z-Image-Turbo-Fun-Controlnet-Union-2.1-8steps_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "to_q,to_k,to_v,to_out.0,w1,w2,w3" \
  --lora_rank 32 \
  --extra_inputs "controlnet_image" \
  --use_gradient_checkpointing \
  --dataset_num_workers 8
