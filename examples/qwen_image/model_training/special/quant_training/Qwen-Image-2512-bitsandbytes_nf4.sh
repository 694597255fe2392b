#!/usr/bin/env bash
# LoRA on Qwen-Image-2512 with its transformer's frozen weights in 4-bit NF4: the reference's command. Run from the
# repository root; needs bitsandbytes (pip install -c constraints.txt bitsandbytes). Make a dataset as for
# ../../lora/Qwen-Image.sh.
#
# --quant_options quantizes the transformer's Linear weights to 4 bits (about a quarter of bf16's memory, about 9%
# error per weight); the layers after the "/" stay in full precision: the modulation layers, the input and output
# projections and the timestep embedding, which the whole image depends on. The LoRA trains in float32 on top; use it
# on the full-precision model.
set -e

accelerate launch examples/qwen_image/model_training/train.py \
  --dataset_base_path data/example_image_dataset \
  --dataset_metadata_path data/example_image_dataset/metadata.csv \
  --max_pixels 1048576 \
  --dataset_repeat 50 \
  --model_id_with_origin_paths "Qwen/Qwen-Image-2512:transformer/diffusion_pytorch_model*.safetensors,Qwen/Qwen-Image:text_encoder/model*.safetensors,Qwen/Qwen-Image:vae/diffusion_pytorch_model.safetensors" \
  --quant_options "Qwen/Qwen-Image-2512:transformer/diffusion_pytorch_model*.safetensors:bitsandbytes_nf4/img_mod.1,txt_mod.1,norm_out.linear,img_in,txt_in,proj_out,timestep_embedder.linear_1,timestep_embedder.linear_2" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Qwen-Image-2512_quant_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "to_q,to_k,to_v,add_q_proj,add_k_proj,add_v_proj,to_out.0,to_add_out,img_mlp.net.2,img_mod.1,txt_mlp.net.2,txt_mod.1" \
  --lora_rank 32 \
  --use_gradient_checkpointing \
  --dataset_num_workers 8 \
  --find_unused_parameters
