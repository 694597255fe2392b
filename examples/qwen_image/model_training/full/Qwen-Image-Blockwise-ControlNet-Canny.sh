#!/usr/bin/env bash
# Full fine-tune of the Canny Blockwise ControlNet beside the frozen Qwen-Image transformer: the reference's
# command. Run from the repository root.
#
# The dataset is a folder of images plus metadata.csv (columns image, blockwise_controlnet_image, prompt: the
# target, its control image (edges (a Canny map)) and the caption). To try the command on a small procedurally drawn one:
#   python -m diffsynth.core.data.example_edit_dataset --output data/example_blockwise_controlnet_dataset --column blockwise_controlnet_image
# The model files are read from DIFFSYNTH_MODEL_BASE_PATH (default ./models) and downloaded there when missing.
# epoch-<e>.safetensors holds the ControlNet's weights under the release's names (the file loads in place of
# the released model.safetensors, e.g. through --model_paths).
set -e

accelerate launch examples/qwen_image/model_training/train.py \
  --dataset_base_path data/example_blockwise_controlnet_dataset \
  --dataset_metadata_path data/example_blockwise_controlnet_dataset/metadata.csv \
  --data_file_keys "image,blockwise_controlnet_image" \
  --max_pixels 1048576 \
  --dataset_repeat 400 \
  --model_id_with_origin_paths "Qwen/Qwen-Image:transformer/diffusion_pytorch_model*.safetensors,Qwen/Qwen-Image:text_encoder/model*.safetensors,Qwen/Qwen-Image:vae/diffusion_pytorch_model.safetensors,DiffSynth-Studio/Qwen-Image-Blockwise-ControlNet-Canny:model.safetensors" \
  --learning_rate 1e-3 \
  --num_epochs 2 \
  --remove_prefix_in_ckpt "pipe.blockwise_controlnet.models.0." \
  --output_path "./models/train/Qwen-Image-Blockwise-ControlNet-Canny_full" \
  --trainable_models "blockwise_controlnet" \
  --extra_inputs "blockwise_controlnet_image" \
  --use_gradient_checkpointing \
  --find_unused_parameters

# If you want to pre-train a Blockwise ControlNet from scratch,
# please run the following script to first generate the initialized model weights file,
# and then start training with a high learning rate (1e-3).

# python examples/qwen_image/model_training/scripts/Qwen-Image-Blockwise-ControlNet-Initialize.py

# accelerate launch examples/qwen_image/model_training/train.py \
#   --dataset_base_path data/example_blockwise_controlnet_dataset \
#   --dataset_metadata_path data/example_blockwise_controlnet_dataset/metadata.csv \
#   --data_file_keys "image,blockwise_controlnet_image" \
#   --max_pixels 1048576 \
#   --dataset_repeat 50 \
#   --model_id_with_origin_paths "Qwen/Qwen-Image:transformer/diffusion_pytorch_model*.safetensors,Qwen/Qwen-Image:text_encoder/model*.safetensors,Qwen/Qwen-Image:vae/diffusion_pytorch_model.safetensors" \
#   --model_paths '["models/blockwise_controlnet.safetensors"]' \
#   --learning_rate 1e-3 \
#   --num_epochs 2 \
#   --remove_prefix_in_ckpt "pipe.blockwise_controlnet.models.0." \
#   --output_path "./models/train/Qwen-Image-Blockwise-ControlNet-Canny_full" \
#   --trainable_models "blockwise_controlnet" \
#   --extra_inputs "blockwise_controlnet_image" \
#   --use_gradient_checkpointing \
#   --find_unused_parameters
