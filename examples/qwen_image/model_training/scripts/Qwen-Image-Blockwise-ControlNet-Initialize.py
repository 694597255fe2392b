"""Writes a zero-initialised Qwen-Image Blockwise ControlNet (Canny / Depth layout) to
models/blockwise_controlnet.safetensors, to pre-train one from scratch: the reference's script, on this package's
model (no GPU needed). Run from the repository root, then the commented-out command of
full/Qwen-Image-Blockwise-ControlNet-Canny.sh (or -Depth.sh), which loads it with --model_paths.
"""

from diffsynth.pipelines.qwen_image.blockwise_model import write_initial_controlnet


def main(path: str = "models/blockwise_controlnet.safetensors", **config: int) -> None:
    print(f"wrote {write_initial_controlnet(path, **config)}")


if __name__ == "__main__":
    main()
