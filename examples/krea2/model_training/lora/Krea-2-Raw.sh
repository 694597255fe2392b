#!/usr/bin/env bash
# LoRA on the Krea-2-Raw transformer: the reference's command. Run from the repository root.
#
# The dataset is a folder of images plus metadata.csv (columns image,prompt). To try the command on a small
# procedurally drawn one:  python -m diffsynth.core.data.example_dataset --output data/diffsynth_example_dataset/krea2/Krea-2-Raw
# The model files are read from DIFFSYNTH_MODEL_BASE_PATH (default ./models) and downloaded there when missing: Krea's
# single file, Qwen3-VL-4B-Instruct (text encoder and, at its root, the tokenizer) and Qwen-Image's VAE.
# --lora_target_modules names Krea's own modules (wq, gate, tmlp.0, ...), mapped to diffusers' names. The LoRA is
# written to the --output_path as epoch-<e>.safetensors under Krea's names (diffusion_model.blocks.0.attn.wq...),
# which diffusers' Krea2Pipeline.load_lora_weights reads; --align_to_opensource_format (as here) writes diffusers'
# names under transformer. instead, the layout of Krea's LoRA releases.
set -e

accelerate launch examples/krea2/model_training/train.py \
  --dataset_base_path data/diffsynth_example_dataset/krea2/Krea-2-Raw \
  --dataset_metadata_path data/diffsynth_example_dataset/krea2/Krea-2-Raw/metadata.csv \
  --max_pixels 1048576 \
  --dataset_repeat 50 \
  --model_id_with_origin_paths "krea/Krea-2-Raw:raw.safetensors,Qwen/Qwen3-VL-4B-Instruct:*.safetensors,Qwen/Qwen-Image:vae/diffusion_pytorch_model.safetensors" \
  --tokenizer_path "Qwen/Qwen3-VL-4B-Instruct:" \
  --learning_rate 1e-4 \
  --num_epochs 5 \
  --remove_prefix_in_ckpt "pipe.dit." \
  --output_path "./models/train/Krea-2-Raw_lora" \
  --lora_base_model "dit" \
  --lora_target_modules "wq,wk,wv,gate,wo,gate,up,down,first,tmlp.0,tmlp.2,projector,txtmlp.1,txtmlp.3,last.linear,tproj.1" \
  --lora_rank 32 \
  --use_gradient_checkpointing \
  --find_unused_parameters \
  --align_to_opensource_format
