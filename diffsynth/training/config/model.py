"""The model section: which model files a run loads, how they are stored, and the pipeline-specific load options."""

from __future__ import annotations

import argparse
import dataclasses

from .errors import split_csv
from .section import Section

TORCH_DTYPES = ("bfloat16", "float16", "float32")


@dataclasses.dataclass(frozen=True)
class ModelSection(Section):
    """The flags that name the model files and where they are built."""

    model_paths: str | None = None
    model_id_with_origin_paths: str | None = None
    tokenizer_path: str | None = None
    tokenizer_1_path: str | None = None
    tokenizer_2_path: str | None = None
    processor_path: str | None = None
    zero_cond_t: bool = False
    extra_inputs: str | None = None
    offload_models: str | None = None
    fp8_models: str | None = None
    quant_options: str | None = None
    torch_dtype: str = "bfloat16"
    initialize_model_on_cpu: bool = False
    enable_npu_patch: bool = False

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, video: bool = False) -> None:
        """Adds the Model group."""
        group = parser.add_argument_group("Model")
        group.add_argument("--model_paths", type=str, default=None,
                           help='JSON list of local model files, an entry per model; a list entry holds the shards of '
                                'one model, e.g. \'["vae.safetensors", ["dit-1.safetensors", "dit-2.safetensors"]]\'.')
        group.add_argument("--model_id_with_origin_paths", type=str, default=None,
                           help="Comma list of model_id:file_pattern entries, resolved under DIFFSYNTH_MODEL_BASE_PATH "
                                "and downloaded only when missing.")
        group.add_argument("--tokenizer_path", type=str, default=None,
                           help="Tokenizer folder, or a model_id:pattern entry such as "
                                "black-forest-labs/FLUX.2-klein-4B:tokenizer/; unset takes it from the model "
                                "repository.")
        group.add_argument("--tokenizer_1_path", type=str, default=None,
                           help="FLUX.1: CLIP's tokenizer folder (or model_id:pattern), the reference's name for "
                                "--tokenizer_path; unset takes black-forest-labs/FLUX.1-dev:tokenizer/.")
        group.add_argument("--tokenizer_2_path", type=str, default=None,
                           help="FLUX.1: T5's tokenizer folder (or model_id:pattern); unset takes the tokenizer_2/ "
                                "folder of T5's repository (black-forest-labs/FLUX.1-dev:tokenizer_2/).")
        group.add_argument("--processor_path", type=str, default=None,
                           help="Qwen-Image-Edit: Qwen2.5-VL processor folder that reads the edit images; unset takes "
                                "the processor/ folder of the transformer's repository.")
        group.add_argument("--zero_cond_t", action="store_true",
                           help="Qwen-Image-Edit-2511: modulate the edit images' tokens as at timestep 0. The released "
                                "2511 transformer's config already turns it on; the flag turns it on for any other.")
        group.add_argument("--extra_inputs", type=str, default=None,
                           help="Comma list of extra metadata columns passed to the pipeline (e.g. edit_image).")
        group.add_argument("--offload_models", type=str, default=None,
                           help="Entries of --model_id_with_origin_paths that this stage never computes with (split "
                                "training); they are built without weights, so they cost no memory or load time.")
        group.add_argument("--fp8_models", type=str, default=None,
                           help="Entries of --model_id_with_origin_paths whose frozen Linear and convolution weights "
                                "are stored in float8 (scaled per output row or channel, cast up to --torch_dtype for "
                                "each call, so nothing computes in fp8): half the memory and offload traffic of bf16, "
                                "about 2.5%% weight error. Embeddings, norms and biases stay in --torch_dtype (small, "
                                "or read by index), as do layers the model class keeps in float32 (its code casts "
                                "their inputs to their dtype); a listed model with no Linear or convolution layer is "
                                "only noted. A LoRA on such a model trains in float32 as usual.")
        group.add_argument("--quant_options", type=str, default=None,
                           help="Quantize loaded models' frozen Linear weights: semicolon list of "
                                "<model>:<method>[/<excluded layers>], <model> copied from "
                                "--model_id_with_origin_paths, e.g. "
                                "'Qwen/Qwen-Image:transformer/diffusion_pytorch_model*.safetensors:bitsandbytes_nf4/img"
                                "_in,proj_out'. Method bitsandbytes_nf4 (pip install bitsandbytes): 4-bit NormalFloat "
                                "weights computed in --torch_dtype, about 0.56 bytes per weight and 9%% weight error; "
                                "excluded layers (matched by name or name end) stay in full precision. A LoRA on such "
                                "a model trains in float32. Not with --enable_model_cpu_offload or --blocks_to_swap.")
        group.add_argument("--torch_dtype", type=str, default="bfloat16", choices=TORCH_DTYPES,
                           help="dtype the models are loaded and computed in; LoRA weights always train in float32.")
        group.add_argument("--initialize_model_on_cpu", action="store_true",
                           help="Build the models on the CPU and move them later; slower start, lower peak VRAM.")
        group.add_argument("--enable_npu_patch", action="store_true",
                           help="Z-Image on Ascend NPUs (the reference's flag): its fused RMSNorm and rope operators. "
                                "No NPU runs this trainer, so it changes nothing, as the reference's on a GPU.")

    @property
    def extra_input_names(self) -> list[str]:
        """The extra metadata columns passed to the pipeline (``--extra_inputs``)."""
        return split_csv(self.extra_inputs)

    def problems(self) -> list[str]:
        problems = super().problems()
        if self.quant_options:
            from .quant_flags import parse_quant_options

            try:
                parse_quant_options(self.quant_options)
            except ValueError as error:
                problems.append(str(error))
        return problems
