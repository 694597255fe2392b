#!/usr/bin/env bash
# Direct distillation of Qwen-Image into a few-step LoRA: the reference's command. Run from the repository root.
#
# The dataset holds images the base model generated with many steps, and per image how the distilled sampler should
# reproduce it: metadata.csv with the columns image,prompt,seed,rand_device,num_inference_steps,cfg_scale, e.g.
#   image_000.png,"a red square",0,cpu,4,1
# (render each image with the base model, e.g. python examples/qwen_image/model_training/validate_lora/Qwen-Image.py
# --lora_alpha_scale 0 --steps 40 --seed 0 --prompt "a red square"). --task direct_distill runs the whole
# num_inference_steps loop from the seed's noise (on rand_device, as inference draws it), guided by cfg_scale when it
# is not 1, and matches the image. Keep --height and --width at the images' size, so nothing is rescaled. Sample with
# the LoRA at the steps and cfg_scale it was distilled for (e.g. 4 steps, cfg_scale 1), any seed.
set -e

accelerate launch examples/qwen_image/model_training/train.py \
  --dataset_base_path data/example_distill_dataset \
  --dataset_metadata_path data/example_distill_dataset/metadata.csv \
  --data_file_keys "image" \
  --extra_inputs "seed,rand_device,num_inference_steps,cfg_scale" \
  --height 1328 \
  --width 1328 \
  --dataset_repeat 50 \
  --model_id_with_origin_paths "Qwen/Qwen-Image:transformer/diffusion_pytorch_model*.safetensors,Qwen/Qwen-Image:text_encoder/model*.safetensors,Qwen/Qwen-Image:vae/diffusion_pytorch_model.safetensors" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Qwen-Image-Distill-LoRA_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "to_q,to_k,to_v,add_q_proj,add_k_proj,add_v_proj,to_out.0,to_add_out,img_mlp.net.2,img_mod.1,txt_mlp.net.2,txt_mod.1" \
  --lora_rank 32 \
  --use_gradient_checkpointing \
  --dataset_num_workers 8 \
  --find_unused_parameters \
  --task direct_distill
