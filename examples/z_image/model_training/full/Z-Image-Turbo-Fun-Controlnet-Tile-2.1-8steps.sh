#!/usr/bin/env bash
# Full fine-tune of the 8-step Tile ControlNet (a low-resolution image as control) beside the frozen Z-Image-Turbo
# transformer: the reference's command. Run from the repository root.
#
# The dataset is a folder of images plus metadata.csv (columns image,controlnet_image,prompt: the target
# and its control image). To try the command on a small procedurally drawn one:
#  python -m diffsynth.core.data.example_edit_dataset --output data/example_controlnet_dataset --column controlnet_image
# The model files are read from DIFFSYNTH_MODEL_BASE_PATH (default ./models) and downloaded there when missing.
# epoch-<e>.safetensors holds the ControlNet's weights under the release's names (the file loads
# in place of the released one).
set -e

accelerate launch examples/z_image/model_training/train.py \
  --dataset_base_path data/example_controlnet_dataset \
  --dataset_metadata_path data/example_controlnet_dataset/metadata.csv \
  --data_file_keys "image,controlnet_image" \
  --max_pixels 1048576 \
  --dataset_repeat 100 \
  --model_id_with_origin_paths "PAI/Z-Image-Turbo-Fun-Controlnet-Union-2.1:Z-Image-Turbo-Fun-Controlnet-Tile-2.1-8steps.safetensors,Tongyi-MAI/Z-Image-Turbo:transformer/*.safetensors,Tongyi-MAI/Z-Image-Turbo:text_encoder/*.safetensors,Tongyi-MAI/Z-Image-Turbo:vae/diffusion_pytorch_model.safetensors" \
  --learning_rate 1e-5 \
  --num_epochs 2 \
  --remove_prefix_in_ckpt "pipe.controlnet." \
  --output_path "./models/train/Z-Image-Turbo-Fun-Controlnet-Tile-2.1-8steps_full" \
  --trainable_models "controlnet" \
  --extra_inputs "controlnet_image" \
  --use_gradient_checkpointing \
  --dataset_num_workers 8
