"""What the reference's ``validate_lora`` / ``validate_full`` scripts do, family by family the same: load the models
the training script trained on, merge the trained LoRA at a strength (or load a full fine-tune's weights over the
released ones), render one sample from a seed and write it atomically.

An image family's script is an ``ImageScript``: its release's files, the pipeline, the trained file's default, the
inputs it renders with and the reference's sampling defaults; ``ImageScript.main`` does the rest. Its
``validate_full`` twin is the same script with ``full=True`` and the full run's file (``ImageScript.full``). Video
families keep their own module beside their scripts (``examples/wanvideo/.../wan_validate.py``) on the same steps.

The LoRA is merged into the weights (``diffsynth.lora.load_lora``): sampling costs what it costs without one, and the
merge is undone only by reloading. ``--lora_alpha_scale 0`` renders the base model from the same seed;
``--before_after`` renders it first from the same load and writes both side by side with their difference.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from .config.validate_script import Defaults, InputFlag, Rendering, Weights, add_flags, read_flags

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")
# What an image script may render with besides the prompt, as its pipeline's call (or load) names it.
IMAGE_INPUTS = {
    "edit_image": InputFlag("images", "the image(s) to edit, in picture order (the prompt calls them picture 1, 2...)"),
    "as_list": InputFlag("switch", "pass a single --edit_image as a one-image list (Edit-2509's prompt form)"),
    "kontext_images": InputFlag("images", "the reference image(s) the prompt changes"),
    "controlnet_image": InputFlag("image", "the control image: edges, depth, pose... (for Tile a low-resolution "
                                           "image)"),
    "controlnet_scale": InputFlag("number", "how strongly the control image steers (the reference's 0.7)", default=0.7),
    "layer_input_image": InputFlag("image", "the image to split into layers (its alpha channel is kept)"),
    "layer_num": InputFlag("integer", "how many layers to split it into", default=3),
    "context_image": InputFlag("image", "the in-context control image the LoRA learned to follow (edges, depth, a "
                                        "pose; Layered-Control V2: the mask of the layer to extract)"),
    "processor_path": InputFlag("folder", "the processor folder (unset: the release's own)"),
    "zero_cond_t": InputFlag("switch", "turn on Edit-2511's zero_cond_t (its transformer config already does)"),
}
# Inputs that are options of ``from_pretrained`` rather than of the call; flags that come with another input.
LOAD_INPUTS = ("processor_path", "zero_cond_t")
COMPANIONS = {"as_list": "edit_image", "controlnet_scale": "controlnet_image", "layer_num": "layer_input_image"}


def load_pipeline(pipeline: str | type, run: Rendering, **options: Any) -> Any:
    """The pipeline (``"module:Class"`` or the class) with the models ``run.models`` names (and its tokenizer)."""
    from ..core import parse_model_id_with_origin_paths
    from ..pipelines.registry import load
    from .startup.pipeline import tokenizer_config

    pipeline_class = load(pipeline) if isinstance(pipeline, str) else pipeline
    return pipeline_class.from_pretrained(
        torch_dtype=run.torch_dtype, device=run.device, model_configs=parse_model_id_with_origin_paths(run.models),
        tokenizer_config=tokenizer_config(run.tokenizer) if run.tokenizer else None, **options)


def apply_weights(pipe: Any, run: Rendering, fail: Callable[[str], NoReturn], release: str) -> None:
    """Merges each LoRA at ``run.strength`` into its slots, or (``run.full``) loads each full fine-tune's weights over
    its slot's; a slot the pipeline did not load (an optional second transformer) is skipped."""
    from ..lora import load_lora
    from .outputs.initial_weights import load_initial_weights

    for flag, slots, path in run.weights:
        for slot in [slot for slot in slots if path and getattr(pipe, slot, None) is not None]:
            if run.full:
                try:  # the flat file names the slot's weights as the model names them
                    count = load_initial_weights(pipe, path, f"pipe.{slot}.", flag)
                except (ValueError, RuntimeError) as error:  # a name or shape of another model
                    fail(f"{error}; pass the epoch-<e>.safetensors of a full fine-tune of {release}")
                print(f"loaded {count} weights from {path} into {slot}")
            else:
                layers = load_lora(getattr(pipe, slot), path, alpha=run.strength)
                print(f"merged {layers} LoRA layers from {path} into {slot} (scale {run.strength})")


def write_image(image: Any, path: Path) -> Path:
    """Writes a PIL image atomically, in the format its suffix names (a layer's alpha is dropped in a JPEG)."""
    from PIL import Image

    from ..core.files import atomic_write

    image_format = Image.registered_extensions()[path.suffix.lower()]
    if image_format == "JPEG" and image.mode != "RGB":
        image = image.convert("RGB")
    return atomic_write(path, lambda temporary: image.save(temporary, format=image_format))


@dataclass(frozen=True)
class ImageScript:
    """One image release's validate script.

    Attributes:
        name: The release, as the script's file is named.
        pipeline: ``"module:Class"`` of the pipeline its ``train.py`` trains.
        models: ``--model_id_with_origin_paths`` of its training script.
        trained: The file its training script writes last (the ``--lora_path`` / ``--checkpoint_path`` default).
        slots: The pipeline slots the trained file applies to (``dit``; a UNet family's ``unet``).
        inputs: Names of ``IMAGE_INPUTS`` it renders with; ``required``: those it cannot render without.
        tokenizer: ``--tokenizer_path`` of its training script, if it gives one.
        prompt: The reference script's prompt; ``call``: its other call arguments that the shared flags set
            (``cfg_scale``, ``height``, ``width``, ``num_inference_steps``, ``seed``, ``negative_prompt``).
        output: The file the reference script writes.
        input_defaults: Its own defaults of input flags, over ``IMAGE_INPUTS``' (``as_list`` for the releases that
            take edit images as a list, the reference's ``controlnet_scale``).
        control_input: ``"module:Class"`` wrapping ``--controlnet_image`` for the call's ``controlnet_inputs``.
        full: Whether it loads a full fine-tune (a ``validate_full`` script).
    """

    name: str
    pipeline: str
    models: str
    trained: str
    slots: tuple[str, ...] = ("dit",)
    inputs: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    tokenizer: str | None = None
    prompt: str = "a dog"
    call: Mapping[str, Any] = field(default_factory=dict)
    output: str = "image.jpg"
    input_defaults: Mapping[str, Any] = field(default_factory=dict)
    control_input: str | None = None
    full: bool = False

    def with_full(self, trained: str, **changes: Any) -> ImageScript:
        """The ``validate_full`` twin: ``trained`` is the full run's file; ``changes`` its other differences."""
        return dataclasses.replace(self, trained=trained, full=True, **changes)

    def with_trained(self, trained: str) -> ImageScript:
        """The same script reading another run's file (a ``special/`` run's)."""
        return dataclasses.replace(self, trained=trained)

    def weights(self) -> list[Weights]:
        """The flag of the trained file."""
        if self.full:
            return [Weights("--checkpoint_path", self.slots, self.trained, "the weights a full fine-tune wrote (its "
                            "epoch-<e>.safetensors or step-<s>.safetensors)")]
        return [Weights("--lora_path", self.slots, self.trained, "LoRA .safetensors written by the trainer (or "
                        f"another {self.name} LoRA)")]

    def input_flags(self) -> dict[str, InputFlag]:
        """The script's input flags, required ones marked."""
        wanted = [*self.inputs, *(name for name, main in COMPANIONS.items() if main in self.inputs)]
        return {name: dataclasses.replace(IMAGE_INPUTS[name], required=name in self.required,
                                          default=self.input_defaults.get(name, IMAGE_INPUTS[name].default))
                for name in wanted}

    def build_parser(self) -> argparse.ArgumentParser:
        """The script's flags, with the reference script's defaults."""
        what = "a full fine-tune loaded over the released weights" if self.full else "a LoRA merged into the model"
        parser = argparse.ArgumentParser(description=f"Render an image with {self.name} and {what}.")
        call = self.call
        defaults = Defaults(prompt=self.prompt, models=self.models, output=self.output, tokenizer=self.tokenizer,
                            negative_prompt=call.get("negative_prompt", ""), cfg_scale=call.get("cfg_scale"),
                            height=call.get("height"), width=call.get("width"), steps=call.get("num_inference_steps"),
                            seed=call.get("seed", 0))
        add_flags(parser, self.weights(), self.full, defaults, self.input_flags(),
                  "image file to write; the suffix picks the format (.png, .jpg, .webp)")
        return parser

    def main(self, argv: Sequence[str] | None = None) -> Path:
        """Loads the models, applies the trained file, renders and writes the image (a layered release: one file
        per layer, ``<output>_<n>``, counted from 1).

        Returns:
            The image file written (a layered release: the first layer's).
        """
        parser = self.build_parser()
        run = read_flags(parser, parser.parse_args(argv), self.weights(), self.full, self.input_flags(),
                         IMAGE_SUFFIXES, self.name)
        options = {"processor_config": _processor(run.inputs.get("processor_path")),
                   "zero_cond_t": True if run.inputs.get("zero_cond_t") else None}
        pipe = load_pipeline(self.pipeline, run, **{key: value for key, value in options.items() if value is not None})
        inputs = self.call_inputs(run.inputs)

        def render() -> Any:
            return pipe(**run.call, **inputs)

        before = render() if run.before_after else None  # the merge below cannot be undone
        apply_weights(pipe, run, parser.error, self.name)
        image = render()
        if isinstance(image, list):  # the composite, then the layers
            paths = [write_image(layer, run.output.with_name(f"{run.output.stem}_{index}{run.output.suffix}"))
                     for index, layer in enumerate(image[1:], start=1)]
            print(f"{len(paths)} layers written to {paths[0].resolve()} and on")
            return paths[0]
        output = write_image(image, run.output)
        print(f"image written to {output.resolve()}")
        if before is not None:
            from ..lora.before_after import save_before_after

            path, change = save_before_after(before, image, run.before_after, run.caption)
            what = "fine-tune" if self.full else "LoRA"
            print(f"without and with the {what}, and their difference ({change.describe()}), written to "
                  f"{path.resolve()}")
        return output

    def call_inputs(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The pipeline call's arguments of the input flags' values (images opened)."""
        from PIL import Image

        from ..pipelines.registry import load

        inputs: dict[str, Any] = {}
        for name in self.inputs:
            value = values.get(name)
            if value is None or name in LOAD_INPUTS:
                continue
            if name == "controlnet_image":
                wrap = load(self.control_input)
                inputs["controlnet_inputs"] = [wrap(image=Image.open(value).convert("RGB"),
                                                    scale=values["controlnet_scale"])]
            elif name == "layer_input_image":
                inputs.update(layer_input_image=Image.open(value).convert("RGBA"), layer_num=values["layer_num"])
            elif IMAGE_INPUTS[name].kind == "image":
                inputs[name] = Image.open(value).convert("RGB")
            else:
                images = [Image.open(path).convert("RGB") for path in value]
                inputs[name] = images if len(images) > 1 or values.get("as_list") else images[0]
        return inputs


def release_script(path: str | Path) -> ImageScript:
    """The ``SCRIPT`` of the ``validate_lora`` script at ``path``: what a ``validate_full`` or ``special/`` script
    renders with (the scripts' file names are no module names, so they are loaded by path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"validate_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SCRIPT


def _processor(path: str | None) -> Any:
    from ..core import ModelConfig

    return ModelConfig(path=path) if path else None
