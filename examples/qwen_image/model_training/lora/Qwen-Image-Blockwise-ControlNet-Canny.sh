#!/usr/bin/env bash
# LoRA on the Qwen-Image transformer with the Canny Blockwise ControlNet in place (frozen): the reference's
# command. Run from the repository root.
#
# The dataset is a folder of images plus metadata.csv (columns image, blockwise_controlnet_image, prompt: the
# target, its control image (edges (a Canny map)) and the caption). To try the command on a small procedurally drawn one:
#   python -m diffsynth.core.data.example_edit_dataset --output data/example_blockwise_controlnet_dataset --column blockwise_controlnet_image
# The model files are read from DIFFSYNTH_MODEL_BASE_PATH (default ./models) and downloaded there when missing.
# The LoRA is a plain Qwen-Image LoRA (it loads in diffusers' QwenImagePipeline.load_lora_weights); use it
# with the same ControlNet.
set -e

accelerate launch examples/qwen_image/model_training/train.py \
  --dataset_base_path data/example_blockwise_controlnet_dataset \
  --dataset_metadata_path data/example_blockwise_controlnet_dataset/metadata.csv \
  --data_file_keys "image,blockwise_controlnet_image" \
  --max_pixels 1048576 \
  --dataset_repeat 50 \
  --model_id_with_origin_paths "Qwen/Qwen-Image:transformer/diffusion_pytorch_model*.safetensors,Qwen/Qwen-Image:text_encoder/model*.safetensors,Qwen/Qwen-Image:vae/diffusion_pytorch_model.safetensors,DiffSynth-Studio/Qwen-Image-Blockwise-ControlNet-Canny:model.safetensors" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Qwen-Image-Blockwise-ControlNet-Canny_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "to_q,to_k,to_v,add_q_proj,add_k_proj,add_v_proj,to_out.0,to_add_out,img_mlp.net.2,img_mod.1,txt_mlp.net.2,txt_mod.1" \
  --lora_rank 32 \
  --extra_inputs "blockwise_controlnet_image" \
  --use_gradient_checkpointing \
  --find_unused_parameters
