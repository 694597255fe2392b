"""What to render while training: the ``--validation_*`` flags and the prompt file, read and checked at start.

``--validation_prompts`` is one prompt (a value that names no file and does not look like a path, as kohya and
ai-toolkit users pass it), or names a text file with one prompt per line (blank lines and lines starting with ``#``
are skipped) or a JSON list whose entries are prompts or objects::

    [
      "a dog on a beach",
      {"prompt": "make the dog blue", "edit_image": "dog.png", "seed": 3},
      {"prompt": "a ship at sea", "height": 480, "width": 832, "num_frames": 33, "fps": 16,
       "input_image": "first_frame.png", "negative_prompt": "blurry"}
    ]

with the keys ``prompt`` (required), ``negative_prompt``, ``height``, ``width``, ``num_frames`` (video), ``fps``
(video), ``seed``, ``edit_image`` (Qwen-Image-Edit: a path, or a list of paths for Edit-2509 / 2511),
``input_image`` (Wan image-to-video: the first frame), ``end_image`` (Wan first-last-frame models: the last frame),
the Wan Fun Control inputs ``control_video`` (a clip of at least ``num_frames`` frames), ``reference_image``,
``camera_control_direction`` and ``camera_control_speed``, and the Wan VACE inputs ``vace_video`` / ``vace_video_mask``
(clips read at the render's size and frame count) and ``vace_reference_image`` (a path or a list), and the
Wan2.2-Animate clips ``animate_pose_video``, ``animate_face_video``, ``animate_inpaint_video`` and
``animate_mask_video`` (read likewise; ``input_image`` is the character), Wan2.2-Animate-2's
``animate2_reference_image``, ``animate2_reference_video`` (read likewise) and ``animate2_prompt_ref`` (a string), and
Qwen-Image EliGen's ``eligen_entity_prompts`` (a list of prompts) and ``eligen_entity_masks`` (a list of mask paths,
one per prompt); paths are relative to the file's folder. Everything is checked when the flags are parsed, before any
model loads: the file, every entry, every image (its header), and every size, which may not exceed what training
itself computes (``--max_pixels``, or ``--height`` x ``--width``; ``--num_frames``), so that rendering stays within the
run's memory plan.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PIL import Image

from ...core.data.buckets import bucket_sizes, nearest_bucket
from ...core.data.errors import DatasetError
from ...core.data.image_modes import check_mode, upright_rgb, upright_size
from ...core.data.operators import ResizeConfig
from ...core.data.video import VIDEO_EXTENSIONS, LoadVideo, is_valid_frame_count
from .errors import FlagError

if TYPE_CHECKING:
    from .dataset import DatasetSection
    from .validation import ValidationSection

#: The entries' image inputs (the list-valued ones may hold several paths), video inputs (a clip's path, read at the
#: render's size and frame count) and the values passed to the pipeline as they are (Wan Fun Control-Camera's motion),
#: as the pipelines' calls name them.
IMAGE_KEYS = ("edit_image", "input_image", "end_image", "reference_image", "vace_reference_image",
              "eligen_entity_masks", "animate2_reference_image")
LIST_IMAGE_KEYS = ("edit_image", "vace_reference_image", "eligen_entity_masks")
VIDEO_KEYS = ("control_video", "vace_video", "vace_video_mask", "animate_pose_video", "animate_face_video",
              "animate_inpaint_video", "animate_mask_video", "animate2_reference_video")
CAMERA_KEYS = ("camera_control_direction", "camera_control_speed")
#: Values passed as they are: the camera's motion, EliGen's entity prompts (as a list) and Animate-2's reference
#: prompt; the last also checked to be text (``TEXT_KEYS``).
TEXT_KEYS = ("animate2_prompt_ref",)
PLAIN_KEYS = (*CAMERA_KEYS, "eligen_entity_prompts", *TEXT_KEYS)
FILE_KEYS = (*IMAGE_KEYS, *VIDEO_KEYS)
INPUT_KEYS = (*FILE_KEYS, *PLAIN_KEYS)
PROMPT_KEYS = ("prompt", "negative_prompt", "height", "width", "num_frames", "fps", "seed", *INPUT_KEYS)
DEFAULT_FPS = 16  # Wan's frame rate
#: Suffixes that make a ``--validation_prompts`` value a file's path even when no such file exists (a mistyped path
#: must not be rendered as a prompt).
PROMPT_FILE_SUFFIXES = (".txt", ".json", ".csv")


class ValidationError(FlagError):
    """The sampling flags or the prompt file are wrong; ``problems`` holds one message per problem."""


@dataclasses.dataclass(frozen=True)
class ValidationPrompt:
    """One entry of the prompt file; unset sizes and seed take the run's defaults."""

    prompt: str
    negative_prompt: str = ""
    height: int | None = None
    width: int | None = None
    num_frames: int | None = None
    fps: int | None = None
    seed: int | None = None
    edit_image: Path | tuple[Path, ...] | None = None
    input_image: Path | None = None
    end_image: Path | None = None
    reference_image: Path | None = None
    control_video: Path | None = None
    camera_control_direction: str | None = None
    camera_control_speed: float | None = None
    vace_reference_image: Path | tuple[Path, ...] | None = None
    vace_video: Path | None = None
    vace_video_mask: Path | None = None
    animate_pose_video: Path | None = None
    animate_face_video: Path | None = None
    animate_inpaint_video: Path | None = None
    animate_mask_video: Path | None = None
    eligen_entity_prompts: tuple[str, ...] | None = None
    eligen_entity_masks: tuple[Path, ...] | None = None
    animate2_reference_image: Path | None = None
    animate2_reference_video: Path | None = None
    animate2_prompt_ref: str | None = None

    def images(self) -> list[Path]:
        """Every image file the entry names."""
        paths = [getattr(self, key) for key in IMAGE_KEYS]
        return [one for value in paths for one in ([value] if isinstance(value, Path) else list(value or ()))]

    def inputs(self) -> set[str]:
        """The pipeline inputs the entry gives besides the prompt, sizes and seed."""
        return {key for key in INPUT_KEYS if getattr(self, key) is not None}


def looks_like_a_path(value: str) -> bool:
    """Whether a ``--validation_prompts`` value that names no file was meant to: it ends in a prompt file's suffix
    (``prompts.txt``), or is one word with a folder in it (``prompts/val``). Any other value is a prompt."""
    if Path(value.strip()).suffix.lower() in PROMPT_FILE_SUFFIXES:
        return True
    return not any(character.isspace() for character in value) and ("/" in value or "\\" in value)


def read_validation_prompts(value: str | Path) -> list[ValidationPrompt]:
    """The entries of ``--validation_prompts``: a prompt file's (see the module docstring), or the value itself as the
    one prompt when it names no file and does not look like a path (:func:`looks_like_a_path`).

    Raises:
        ValidationError: Every problem of the file (or of the prompt) at once, naming the entry, the key and the fix.
    """
    given, path = str(value), Path(value)
    flag = f"--validation_prompts {given}"
    try:
        is_file = path.is_file()
    except OSError:  # a long prompt is too long to be a file name
        is_file = False
    if not is_file and not looks_like_a_path(given):
        if not given.strip():
            raise ValidationError([f"--validation_prompts {given!r} is empty; pass a prompt in quotes, or a prompt file"])
        return [ValidationPrompt(prompt=given.strip())]
    if not is_file:
        fix = ("fix the path to the .txt file (one prompt per line) or the .json list, or pass the prompt itself in "
               "quotes (e.g. --validation_prompts 'a dog on a beach')")
        raise ValidationError([f"{flag} does not exist; {fix}"])
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as error:
        raise ValidationError([f"{flag} cannot be read as UTF-8 text ({error})"]) from error
    if path.suffix.lower() == ".json":
        try:
            entries = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValidationError([f"{flag} is not valid JSON ({error}); fix the file"]) from error
        if not isinstance(entries, list):
            raise ValidationError([f"{flag} holds a JSON {type(entries).__name__}; it must be a list of prompts or "
                                   '{"prompt": ...} objects'])
    else:
        entries = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    if not entries:
        raise ValidationError([f"{flag} holds no prompt; write one prompt per line (or a JSON list)"])
    prompts, problems = [], []
    for number, entry in enumerate(entries, start=1):
        try:
            prompts.append(_entry(entry, path.parent))
        except ValidationError as error:
            problems += [f"{flag} entry {number}: {problem}" for problem in error.problems]
    if problems:
        raise ValidationError(problems)
    return prompts


def _entry(entry: Any, folder: Path) -> ValidationPrompt:
    if isinstance(entry, str):
        entry = {"prompt": entry}
    if not isinstance(entry, dict):
        raise ValidationError([f"is a JSON {type(entry).__name__}; write a prompt string or an object with a "
                               '"prompt" key'])
    problems = [f"has unknown key {key!r}; the keys are {', '.join(PROMPT_KEYS)}" for key in entry
                if key not in PROMPT_KEYS]
    if not isinstance(entry.get("prompt"), str) or not entry["prompt"].strip():
        problems.append('needs a non-empty "prompt" string')
    for key in ("negative_prompt", *TEXT_KEYS):
        if not isinstance(entry.get(key, ""), str):
            problems.append(f'"{key}" must be a string')
    for key in ("height", "width", "num_frames", "fps"):
        value = entry.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            problems.append(f'"{key}" {value!r} must be a positive integer')
    seed = entry.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
        problems.append(f'"seed" {seed!r} must be a non-negative integer')
    if ("height" in entry) != ("width" in entry):
        problems.append('gives one of "height" and "width"; give both, or neither for the run\'s default size')
    problems += _camera_problems(entry) + _entity_problems(entry)
    images: dict[str, Any] = {}
    for key in FILE_KEYS:
        if key in entry:
            names = entry[key] if key in LIST_IMAGE_KEYS and isinstance(entry[key], list) else [entry[key]]
            paths = []
            for name in names:
                if not isinstance(name, str) or not name:
                    problems.append(f'"{key}" holds {name!r}; give a path relative to the prompt file')
                    continue
                paths.append(folder / name)
                check = _image_problems if key in IMAGE_KEYS else _video_problems
                problems += check(folder / name, key)
            images[key] = tuple(paths) if isinstance(entry[key], list) else (paths[0] if paths else None)
    if problems:
        raise ValidationError(problems)
    plain = {key: tuple(value) if isinstance(value, list) else value for key, value in entry.items()}
    return ValidationPrompt(**{**{key: value for key, value in plain.items() if key not in images}, **images})


def _entity_problems(entry: dict[str, Any]) -> list[str]:
    """EliGen's entity prompts: a list of non-empty strings, one per entity mask."""
    prompts, masks = entry.get("eligen_entity_prompts"), entry.get("eligen_entity_masks")
    if prompts is None and masks is None:
        return []
    if not isinstance(prompts, list) or not all(isinstance(text, str) and text.strip() for text in prompts):
        return [f'"eligen_entity_prompts" {prompts!r} must be a list of prompts, one per entity mask']
    count = len(masks) if isinstance(masks, list) else 0 if masks is None else 1
    return [] if count == len(prompts) else [f'gives {len(prompts)} "eligen_entity_prompts" and {count} '
                                             '"eligen_entity_masks"; give one mask per entity prompt']


def _camera_problems(entry: dict[str, Any]) -> list[str]:
    """Problems of Wan Fun Control-Camera's motion: its values' types."""
    problems = []
    direction, speed = entry.get("camera_control_direction"), entry.get("camera_control_speed")
    if direction is not None and (not isinstance(direction, str) or not direction):
        problems.append(f'"camera_control_direction" {direction!r} must name a motion, e.g. "Left"')
    if speed is not None and (not isinstance(speed, (int, float)) or isinstance(speed, bool)):
        problems.append(f'"camera_control_speed" {speed!r} must be a number, e.g. 0.0185')
    return problems


def _video_problems(path: Path, key: str) -> list[str]:
    if not path.is_file() or path.suffix.lower() not in VIDEO_EXTENSIONS:
        return [f'"{key}" {path} is not a video file ({", ".join(VIDEO_EXTENSIONS)}); fix the path']
    return []


def _image_problems(path: Path, key: str) -> list[str]:
    try:
        with Image.open(path) as image:
            mode = image.mode
    except (OSError, ValueError) as error:
        return [f'"{key}" {path} is not an image PIL can read ({error}); fix the path or the file']
    try:
        check_mode(mode, path)
    except DatasetError as error:
        return [f'"{key}" {error}']
    return []


@dataclasses.dataclass(frozen=True)
class ValidationConfig:
    """When and how training renders samples (the ``--validation_*`` flags), checked at construction.

    Attributes:
        prompts: The entries of the prompt file.
        every_steps: Render every this many optimizer steps (``--validation_steps``), or never.
        every_epochs: Render at the end of every this many epochs (``--validation_epochs``), or never.
        num_inference_steps: Denoising steps of each render.
        cfg_scale: Classifier-free guidance scale; None: the pipeline's default (Qwen-Image 4, Wan 5).
        seed: The seed of entries without one.
        max_pixels: The largest frame area training computes (``--max_pixels``, or ``--height`` x ``--width``):
            renders may not be larger.
        fixed_size: ``(--height, --width)``, the size of entries without one; None: the aspect-ratio bucket of the
            entry's (last) image under ``max_pixels``, or the square one.
        max_frames: ``--num_frames`` of a video run; None for images.
    """

    prompts: tuple[ValidationPrompt, ...]
    every_steps: int | None
    every_epochs: int | None
    num_inference_steps: int = 20
    cfg_scale: float | None = None
    seed: int = 0
    max_pixels: int = 1024 * 1024
    fixed_size: tuple[int, int] | None = None
    max_frames: int | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.every_steps is None and self.every_epochs is None:
            problems.append("--validation_prompts needs --validation_steps N and/or --validation_epochs N (when to "
                            "render)")
        for flag, value in (("--validation_steps", self.every_steps), ("--validation_epochs", self.every_epochs),
                            ("--validation_num_inference_steps", self.num_inference_steps)):
            if value is not None and value < 1:
                problems.append(f"{flag} {value} must be at least 1")
        for number, prompt in enumerate(self.prompts, start=1):
            problems += [f"--validation_prompts entry {number}: {problem}" for problem in self._size_problems(prompt)]
        if problems:
            raise ValidationError(problems)

    def _size_problems(self, prompt: ValidationPrompt) -> list[str]:
        problems = []
        if prompt.height is not None and prompt.width is not None and prompt.height * prompt.width > self.max_pixels:
            problems.append(f"{prompt.width}x{prompt.height} is larger than training's frames ({self.max_pixels} "
                            "pixels, --max_pixels or --height x --width), which the run's memory plan is made for; "
                            "render at most that size")
        if self.max_frames is None:
            problems += [f'"{key}" is for video; this trainer renders images' for key in ("num_frames", "fps")
                         if getattr(prompt, key) is not None]
        elif prompt.num_frames is not None and (not is_valid_frame_count(prompt.num_frames)
                                                or prompt.num_frames > self.max_frames):
            problems.append(f'"num_frames" {prompt.num_frames} must be of the form 4k+1 and at most --num_frames '
                            f"{self.max_frames}, which the run's memory plan is made for")
        return problems

    @classmethod
    def from_sections(cls, validation: ValidationSection, dataset: DatasetSection) -> ValidationConfig | None:
        """The run's config, or None without ``--validation_prompts``.

        Raises:
            ValidationError: The file or a flag is wrong.
        """
        if validation.validation_prompts is None:
            return None
        fixed = (dataset.height, dataset.width) if dataset.height is not None else None
        return cls(tuple(read_validation_prompts(validation.validation_prompts)), validation.validation_steps,
                   validation.validation_epochs, validation.validation_num_inference_steps,
                   validation.validation_cfg_scale, validation.validation_seed,
                   dataset.height * dataset.width if fixed else dataset.max_pixels, fixed, dataset.num_frames)

    def due(self, step: int, completed_epochs: int | None = None) -> bool:
        """Whether to render after optimizer step ``step``; ``completed_epochs`` is given at the end of an epoch."""
        if completed_epochs is not None:
            return self.every_epochs is not None and completed_epochs % self.every_epochs == 0
        return self.every_steps is not None and step % self.every_steps == 0

    def size(self, prompt: ValidationPrompt, size_multiple: int) -> tuple[int, int]:
        """``(height, width)`` of an entry: its own, else ``fixed_size``, else the bucket (sides multiples of the
        model's ``size_multiple``) of its last image's aspect ratio, or the square bucket."""
        if prompt.height is not None:
            return prompt.height, prompt.width
        if self.fixed_size is not None:
            return self.fixed_size
        ratio = (1, 1)
        if prompt.images():
            with Image.open(prompt.images()[-1]) as image:
                ratio = upright_size(image)  # as training buckets it: phone photos are stored sideways
        width, height = nearest_bucket(*ratio, bucket_sizes(self.max_pixels, size_multiple))
        return height, width

    def call_arguments(self, prompt: ValidationPrompt, size_multiple: int) -> dict[str, Any]:
        """The pipeline call for one entry: its size, seed, steps, guidance and images (opened now)."""
        images = {key: [_open(path) for path in value] if isinstance(value, tuple) else _open(value)
                  for key in IMAGE_KEYS if (value := getattr(prompt, key)) is not None}
        height, width = self.size(prompt, size_multiple)
        frames = prompt.num_frames or self.max_frames or 1
        resize = ResizeConfig(height=height, width=width, division_factor=size_multiple)
        images.update({key: LoadVideo(frames).load(value, resize) for key in VIDEO_KEYS
                       if (value := getattr(prompt, key)) is not None})
        arguments = {"prompt": prompt.prompt, "negative_prompt": prompt.negative_prompt, "height": height,
                     "width": width, "seed": self.seed if prompt.seed is None else prompt.seed,
                     "num_inference_steps": self.num_inference_steps, "progress_bar": False,
                     **{key: value for key, value in images.items() if value is not None}}
        if self.cfg_scale is not None:
            arguments["cfg_scale"] = self.cfg_scale
        if self.max_frames is not None:
            arguments["num_frames"] = prompt.num_frames or self.max_frames
        arguments.update({key: list(value) if isinstance(value := getattr(prompt, key), tuple) else value
                          for key in PLAIN_KEYS if getattr(prompt, key) is not None})
        return arguments


def _open(path: Path) -> Image.Image:
    """An entry's image decoded as training decodes its data (upright, deep and transparent modes handled)."""
    with Image.open(path) as image:
        return upright_rgb(image, path)
