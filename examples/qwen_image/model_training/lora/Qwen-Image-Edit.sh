#!/usr/bin/env bash
# LoRA on the Qwen-Image-Edit transformer: image editing with one edit image per sample. Run from the repository root.
#
# The dataset is a folder of images plus metadata.csv with the columns image (the edited result the model learns to
# draw), edit_image (the image to edit) and prompt (the instruction). To try the command on a small procedurally drawn
# one:  python -m diffsynth.core.data.example_edit_dataset --output data/example_edit_dataset --num_edit_images 1
# --data_file_keys loads both image columns and --extra_inputs hands edit_image to the pipeline, which shows it to the
# text encoder with the prompt and to the transformer as reference latents; the loss covers the result only.
# The text encoder and VAE are Qwen-Image's; the processor comes from Qwen/Qwen-Image-Edit's processor/ folder.
# Try the LoRA with examples/qwen_image/model_training/validate_lora/Qwen-Image-Edit.py.
set -e

accelerate launch examples/qwen_image/model_training/train.py \
  --dataset_base_path data/example_edit_dataset \
  --dataset_metadata_path data/example_edit_dataset/metadata.csv \
  --data_file_keys "image,edit_image" \
  --extra_inputs "edit_image" \
  --max_pixels 1048576 \
  --dataset_repeat 50 \
  --model_id_with_origin_paths "Qwen/Qwen-Image-Edit:transformer/diffusion_pytorch_model*.safetensors,Qwen/Qwen-Image:text_encoder/model*.safetensors,Qwen/Qwen-Image:vae/diffusion_pytorch_model.safetensors" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Qwen-Image-Edit_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "to_q,to_k,to_v,add_q_proj,add_k_proj,add_v_proj,to_out.0,to_add_out,img_mlp.net.2,img_mod.1,txt_mlp.net.2,txt_mod.1" \
  --lora_rank 32 \
  --use_gradient_checkpointing \
  --dataset_num_workers 8 \
  --find_unused_parameters
