#!/usr/bin/env bash
# LoRA on the FireRed-Image-Edit-1.0 transformer (FireRedTeam's edit model on the Qwen-Image-Edit
# architecture, which diffusers runs with QwenImageEditPlusPipeline): image editing with one or more edit images per
# sample. Run from the repository root.
#
# The dataset is a folder of images plus metadata.json, a list of objects with image (the result), edit_image (a list
# of paths, even for one image) and prompt. To try the command on a small procedurally drawn dataset:
#   python -m diffsynth.core.data.example_edit_dataset --output data/example_edit_pairs_dataset --num_edit_images 2
# The model files are read from DIFFSYNTH_MODEL_BASE_PATH (default ./models) and downloaded there when missing; the
# Qwen2.5-VL processor comes from FireRedTeam/FireRed-Image-Edit-1.0:processor/.
set -e

accelerate launch examples/qwen_image/model_training/train.py \
  --dataset_base_path data/example_edit_pairs_dataset \
  --dataset_metadata_path data/example_edit_pairs_dataset/metadata.json \
  --data_file_keys "image,edit_image" \
  --extra_inputs "edit_image" \
  --max_pixels 1048576 \
  --dataset_repeat 50 \
  --model_id_with_origin_paths "FireRedTeam/FireRed-Image-Edit-1.0:transformer/diffusion_pytorch_model*.safetensors,Qwen/Qwen-Image:text_encoder/model*.safetensors,Qwen/Qwen-Image:vae/diffusion_pytorch_model.safetensors" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/FireRed-Image-Edit-1.0_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "to_q,to_k,to_v,add_q_proj,add_k_proj,add_v_proj,to_out.0,to_add_out,img_mlp.net.2,img_mod.1,txt_mlp.net.2,txt_mod.1" \
  --lora_rank 32 \
  --use_gradient_checkpointing \
  --dataset_num_workers 8 \
  --find_unused_parameters
