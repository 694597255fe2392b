#!/usr/bin/env bash
# The main job on built-in defaults, with no download: a tiny random-weight Qwen-Image repo and a generated example
# dataset, two-stage LoRA training with model CPU offload through the real CLI, then the same prompt and seed rendered
# without and with the trained LoRA (before_after.png).
# Usage: scripts/demo.sh [WORK_DIR] (default ./demo_output). Runs on the CPU in a few minutes; uses CUDA if present.
set -euo pipefail
PYTHON=${PYTHON:-.venv/bin/python}
WORK=${1:-./demo_output}
export DIFFSYNTH_MODEL_BASE_PATH="$WORK/models"
MODELS="Qwen/Qwen-Image:transformer/diffusion_pytorch_model*.safetensors,Qwen/Qwen-Image:text_encoder/model*.safetensors,Qwen/Qwen-Image:vae/diffusion_pytorch_model.safetensors"
DIT="Qwen/Qwen-Image:transformer/diffusion_pytorch_model*.safetensors"
ENCODERS="Qwen/Qwen-Image:text_encoder/model*.safetensors,Qwen/Qwen-Image:vae/diffusion_pytorch_model.safetensors"
LORA=(--lora_base_model dit --lora_target_modules "to_q,to_k,to_v,add_q_proj,add_k_proj,add_v_proj,to_out.0,to_add_out,img_mlp.net.2,img_mod.1,txt_mlp.net.2,txt_mod.1"
      --lora_rank 16 --learning_rate 1e-3 --remove_prefix_in_ckpt pipe.dit. --torch_dtype float32 --seed 0
      --max_pixels 65536 --use_gradient_checkpointing --enable_model_cpu_offload)
# The README's launcher, diffsynth-launch, as a module (a venv installed before the script existed runs it too): a failed
# stage ends with the trainer's message and exit code. One process on any machine; the other options are given so
# that accelerate has no defaults to report.
LAUNCH=("$PYTHON" -m diffsynth.training.launch --num_processes 1 --num_machines 1 --mixed_precision no
        --dynamo_backend no)

echo "== 1/5 tiny Qwen-Image repo -> $DIFFSYNTH_MODEL_BASE_PATH"
"$PYTHON" -m diffsynth.testing.tiny_models --output "$DIFFSYNTH_MODEL_BASE_PATH" --only qwen_image
echo "== 2/5 example dataset -> $WORK/dataset"
"$PYTHON" -m diffsynth.core.data.example_dataset --output "$WORK/dataset" --num_images 8
echo "== 3/5 stage 1: cache the text and image encodings -> $WORK/cache"
"${LAUNCH[@]}" examples/qwen_image/model_training/train.py --task sft:data_process \
  --dataset_base_path "$WORK/dataset" --dataset_metadata_path "$WORK/dataset/metadata.csv" --dataset_repeat 1 \
  --model_id_with_origin_paths "$MODELS" --offload_models "$DIT" --output_path "$WORK/cache" "${LORA[@]}"
echo "== 4/5 stage 2: train the LoRA from the cache -> $WORK/lora"
# A rerun of stage 1 continues its cache; stage 2 replaces the previous demo's LoRA files, checkpoints and metrics.
"${LAUNCH[@]}" examples/qwen_image/model_training/train.py --task sft:train \
  --dataset_base_path "$WORK/cache" --dataset_repeat 10 --num_epochs 2 --enable_csv_log --overwrite_output \
  --model_id_with_origin_paths "$MODELS" --offload_models "$ENCODERS" --output_path "$WORK/lora" "${LORA[@]}"
CAPTION="The demo model is tiny and has random weights, so both pictures are noise and neither shows the prompt. \
What to look at: the difference panel is not black, so the trained LoRA changes the model's output; and \
$WORK/lora/logs/loss.png, where the moving average of the loss falls as the LoRA fits the example images. With a \
real model (docs/en/Quick_Start.md) the left picture is the base model and the middle one shows what the LoRA \
learned."
echo "== 5/5 render the same prompt and seed without and with the trained LoRA -> $WORK/before_after.png"
"$PYTHON" examples/qwen_image/model_training/validate_lora/Qwen-Image.py --lora_path "$WORK/lora/epoch-1.safetensors" \
  --prompt "a teal triangle in the centre of a black to pink gradient" --height 256 --width 256 --steps 8 \
  --torch_dtype float32 --output "$WORK/image.png" --before_after "$WORK/before_after.png" --caption "$CAPTION"

cat <<DONE

Outputs:
  tiny model repo   $DIFFSYNTH_MODEL_BASE_PATH/Qwen/Qwen-Image
  example dataset   $WORK/dataset/metadata.csv
  stage-1 cache     $WORK/cache/0/*.safetensors (cache_info.json beside it)
  LoRA files        $WORK/lora/epoch-0.safetensors, $WORK/lora/epoch-1.safetensors (for ComfyUI, diffusers, DiffSynth-Studio)
  loss log, curve   $WORK/lora/logs/metrics.csv, $WORK/lora/logs/loss.png
  run report        $WORK/lora/logs/report.html (open it in a browser)
  resume points     $WORK/lora/checkpoints/
  generated image   $WORK/image.png (with the LoRA)
  before and after  $WORK/before_after.png (without | with | difference; the random demo weights draw noise)
DONE
