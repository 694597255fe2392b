#!/usr/bin/env bash
# LoRA on Qwen-Image with the least GPU memory DeepSpeed can give: split training, then ZeRO-3 with the weights and
# the optimizer states in CPU memory. Run from the repository root; needs DeepSpeed
# (pip install -c constraints.txt deepspeed --no-build-isolation).
#
# Stage 1 runs as a normal launch (or under the same DeepSpeed config: it prepares no model, so it works either way)
# and caches the text and image encodings. Stage 2 loads only the transformer, on the CPU (--initialize_model_on_cpu),
# and lets ZeRO-3 partition it; gradient checkpointing goes through DeepSpeed's checkpoint, configured by the
# activation_checkpointing section of configs/ds_zero3_cpu_offload.json. Set num_processes in
# configs/accelerate_deepspeed_zero3_cpu_offload.yaml to the number of GPUs.
set -e

accelerate launch examples/qwen_image/model_training/train.py \
  --dataset_base_path data/example_image_dataset \
  --dataset_metadata_path data/example_image_dataset/metadata.csv \
  --max_pixels 1048576 \
  --dataset_repeat 1 \
  --model_id_with_origin_paths "Qwen/Qwen-Image:text_encoder/model*.safetensors,Qwen/Qwen-Image:vae/diffusion_pytorch_model.safetensors" \
  --output_path "./models/train/Qwen-Image_lora_cache" \
  --lora_base_model "dit" \
  --lora_target_modules "to_q,to_k,to_v,add_q_proj,add_k_proj,add_v_proj,to_out.0,to_add_out,img_mlp.net.2,img_mod.1,txt_mlp.net.2,txt_mod.1" \
  --lora_rank 32 \
  --dataset_num_workers 8 \
  --task "sft:data_process"

accelerate launch --config_file configs/accelerate_deepspeed_zero3_cpu_offload.yaml \
  examples/qwen_image/model_training/train.py \
  --dataset_base_path "./models/train/Qwen-Image_lora_cache" \
  --dataset_repeat 50 \
  --model_id_with_origin_paths "Qwen/Qwen-Image:transformer/diffusion_pytorch_model*.safetensors" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Qwen-Image_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "to_q,to_k,to_v,add_q_proj,add_k_proj,add_v_proj,to_out.0,to_add_out,img_mlp.net.2,img_mod.1,txt_mlp.net.2,txt_mod.1" \
  --lora_rank 32 \
  --mixed_precision bf16 \
  --use_gradient_checkpointing \
  --initialize_model_on_cpu \
  --dataset_num_workers 8 \
  --task "sft:train"
