"""Tiny captioned image and video datasets drawn from scratch, for tests, smoke runs and the docs' first commands.

Each image is a two-colour gradient with one coloured shape on it, captioned with what is drawn. Sizes lie between 64
and 320 pixels and cycle through landscape, portrait and square, and most sides are not multiples of 16, so the
dataset's resizing, cropping and rounding are all exercised. The same seed gives the same files.

Each video is the same kind of picture with the shape sliding sideways, wrapping round at the edge, so every frame
differs from the one before. Clips alternate between H.264 ``.mp4`` (MPEG-4 Part 2 where the FFmpeg build lacks
libx264), written with PyAV, and ``.gif``, written with PIL; both are what users bring, and they take different
decoding paths (a stored frame count, palette frames). With ``--audio`` (LTX-2) every clip is an ``.mp4`` with a
two-tone sound, named in an ``input_audio`` column: the clip itself (its sound track) or a ``.wav`` beside a silent
clip, in turn.

    python -m diffsynth.core.data.example_dataset --output data/example_dataset --num_images 8
    python -m diffsynth.core.data.example_dataset --output data/example_video_dataset --kind video --num_frames 9
    python -m diffsynth.core.data.example_dataset --output data/example_av_dataset --kind video --audio
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import random
import wave
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from ..files import atomic_write, atomic_write_text
from .errors import DatasetError
from .video import largest_valid_frame_count

METADATA_FILE = "metadata.csv"
MIN_SIDE, MAX_SIDE = 64, 320
COLOURS = {
    "red": (215, 48, 39), "orange": (244, 140, 30), "yellow": (250, 220, 60), "green": (60, 170, 80),
    "teal": (30, 150, 150), "blue": (40, 90, 200), "purple": (130, 60, 170), "pink": (240, 130, 180),
    "white": (245, 245, 245), "black": (20, 20, 20),
}
SHAPES = ("circle", "square", "triangle", "ring")
PLACES = ("on the left", "in the centre", "on the right")
VIDEO_SIZE = (104, 72)  # neither side a multiple of 16, so loading a clip exercises the rounding too
VIDEO_FPS = 16  # Wan's frame rate
SOUND_RATE = 16000  # the clips' sound: LTX-2's audio VAE rate, so the dataset also exercises no resampling
MIN_VIDEO_SIDE, MAX_VIDEO_SIDE = 32, 1024


def _size(rng: random.Random, index: int) -> tuple[int, int]:
    """Landscape, portrait and square in turn, so every orientation appears in even a three-image dataset."""
    long_side = rng.randint(MIN_SIDE + 64, MAX_SIDE)
    short_side = rng.randint(MIN_SIDE, long_side - 32)
    return [(long_side, short_side), (short_side, long_side), (long_side, long_side)][index % 3]


def _gradient(size: tuple[int, int], start: tuple[int, ...], end: tuple[int, ...], vertical: bool) -> Image.Image:
    width, height = size
    ramp = np.linspace(0.0, 1.0, height if vertical else width)
    ramp = ramp[:, None, None] if vertical else ramp[None, :, None]
    pixels = np.broadcast_to((1 - ramp) * np.array(start) + ramp * np.array(end), (height, width, 3))
    return Image.fromarray(pixels.round().astype(np.uint8))


def _draw_shape(draw: ImageDraw.ImageDraw, shape: str, centre: tuple[int, int], radius: int,
                colour: tuple[int, int, int]) -> None:
    box = (centre[0] - radius, centre[1] - radius, centre[0] + radius, centre[1] + radius)
    if shape == "circle":
        draw.ellipse(box, fill=colour)
    elif shape == "square":
        draw.rectangle(box, fill=colour)
    elif shape == "triangle":
        draw.polygon([(box[0], box[3]), (box[2], box[3]), (centre[0], box[1])], fill=colour)
    else:
        draw.ellipse(box, outline=colour, width=max(2, radius // 4))


def draw_example(rng: random.Random, index: int) -> tuple[Image.Image, str]:
    """One image and its caption, drawn with ``rng``."""
    size = _size(rng, index)
    start, end, fill = rng.sample(sorted(COLOURS), 3)
    vertical = rng.random() < 0.5
    image = _gradient(size, COLOURS[start], COLOURS[end], vertical)
    shape, place = rng.choice(SHAPES), rng.randrange(len(PLACES))
    radius = min(size[0] // 7, size[1] // 3)  # keeps the shape inside its third of the width
    centre = ((place * 2 + 1) * size[0] // 6, size[1] // 2)
    _draw_shape(ImageDraw.Draw(image), shape, centre, radius, COLOURS[fill])
    direction = "top to bottom" if vertical else "left to right"
    article = "an" if start[0] in "aeiou" else "a"
    caption = f"a {fill} {shape} {PLACES[place]} of {article} {start} to {end} gradient running {direction}"
    return image, caption


def _check_count(flag: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise DatasetError(f"{flag} {value!r} must be an integer of at least 1")


def _write_metadata(folder: Path, file_column: str, rows: Sequence[tuple[str, ...]],
                    more_columns: Sequence[str] = ()) -> Path:
    """Writes ``metadata.csv`` with the columns ``file_column,prompt`` (and ``more_columns``) atomically; returns its
    path."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow((file_column, "prompt", *more_columns))
    writer.writerows(rows)
    return atomic_write_text(folder / METADATA_FILE, text.getvalue())


def build_example_dataset(folder: str | os.PathLike, num_images: int = 4, seed: int = 0) -> Path:
    """Writes ``num_images`` PNG images and ``metadata.csv`` (columns ``image,prompt``) into ``folder``.

    Args:
        folder: The dataset folder (``--dataset_base_path``); created if missing, existing files overwritten.
        num_images: How many images to draw.
        seed: The same seed writes the same images and captions.

    Returns:
        The metadata file (``--dataset_metadata_path``).

    Raises:
        DatasetError: ``num_images`` is below 1.
    """
    _check_count("--num_images", num_images)
    folder = Path(folder)
    rng = random.Random(seed)
    rows = []
    for index in range(num_images):
        image, caption = draw_example(rng, index)
        name = f"image_{index:03d}.png"
        atomic_write(folder / name, lambda temporary, image=image: image.save(temporary, format="PNG"))
        rows.append((name, caption))
    return _write_metadata(folder, "image", rows)


def draw_example_video(rng: random.Random, num_frames: int, size: tuple[int, int]) -> tuple[list[Image.Image], str]:
    """One clip of ``num_frames`` RGB frames of ``size`` and its caption, drawn with ``rng``."""
    start, end, fill = rng.sample(sorted(COLOURS), 3)
    vertical = rng.random() < 0.5
    shape = rng.choice(SHAPES)
    rightwards = rng.random() < 0.5
    width, height = size
    background = _gradient(size, COLOURS[start], COLOURS[end], vertical)
    radius = max(2, min(width // 7, height // 3))
    # One crossing over the clip, but at least 2 pixels a frame: PIL merges identical consecutive GIF frames, which
    # would shorten a long clip. The shape wraps round at the edge, so it keeps moving the way the caption says.
    step = max(2.0, (width - 2 * radius) / max(1, num_frames - 1))
    frames = []
    for index in range(num_frames):
        x = round(radius + index * step) % width
        x = x if rightwards else width - 1 - x
        frame = background.copy()
        draw = ImageDraw.Draw(frame)
        for offset in (-width, 0, width):  # the copies off the canvas draw the part that wrapped round
            _draw_shape(draw, shape, (x + offset, height // 2), radius, COLOURS[fill])
        frames.append(frame)
    article = "an" if start[0] in "aeiou" else "a"
    caption = (f"a {fill} {shape} moving {'left to right' if rightwards else 'right to left'} across {article} "
               f"{start} to {end} gradient running {'top to bottom' if vertical else 'left to right'}")
    return frames, caption


def mp4_codec() -> str:
    """H.264 (libx264) when the installed FFmpeg has it, as most user clips are; else MPEG-4 Part 2, always built."""
    import av

    return "libx264" if "libx264" in av.codecs_available else "mpeg4"


def write_mp4(path: Path, frames: Sequence[Image.Image], fps: int = VIDEO_FPS, sound: np.ndarray | None = None
              ) -> None:
    """Encodes ``frames`` (RGB, even sides) to an mp4 at ``path``, with ``sound`` (a stereo ``[2, samples]`` float32
    waveform at ``SOUND_RATE``) as its AAC track when given; the same frames give the same bytes."""
    import av

    codec = mp4_codec()
    # The format is explicit because atomic_write hands over a temporary name ending in .tmp.
    with av.open(str(path), "w", format="mp4") as container:
        track: Any = None if sound is None else container.add_stream("aac", rate=SOUND_RATE)
        if track is not None:
            track.layout = "stereo"
        stream: Any = container.add_stream(codec, rate=fps)
        stream.width, stream.height = frames[0].size
        stream.pix_fmt = "yuv420p"  # what every player and decoder takes
        stream.codec_context.options = {"threads": "1"}  # one encoder thread: identical bytes on every run
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_image(frame)))
        container.mux(stream.encode())  # flush the frames the encoder still holds
        if track is not None:
            audio = av.AudioFrame.from_ndarray(np.ascontiguousarray(sound), format="fltp", layout="stereo")
            audio.sample_rate = SOUND_RATE
            container.mux(track.encode(audio))
            container.mux(track.encode())


def write_gif(path: Path, frames: Sequence[Image.Image], fps: int = VIDEO_FPS) -> None:
    """Writes ``frames`` as a looping GIF at ``path``."""
    frames[0].save(path, format="GIF", save_all=True, append_images=list(frames[1:]), duration=round(1000 / fps),
                   loop=0)


def example_sound(rng: random.Random, seconds: float) -> np.ndarray:
    """A stereo ``[2, samples]`` float32 chord of two random tones at ``SOUND_RATE``, one per channel."""
    time = np.arange(round(seconds * SOUND_RATE)) / SOUND_RATE
    pitches = [rng.uniform(220.0, 880.0) for _ in range(2)]
    return np.stack([0.4 * np.sin(2 * np.pi * pitch * time) for pitch in pitches]).astype(np.float32)


def write_wav(path: Path, sound: np.ndarray) -> None:
    """Writes a ``[channels, samples]`` waveform in ``[-1, 1]`` as 16-bit PCM at ``SOUND_RATE``."""
    with wave.open(str(path), "wb") as file:
        file.setnchannels(sound.shape[0])
        file.setsampwidth(2)
        file.setframerate(SOUND_RATE)
        file.writeframes(np.round(sound.T * 32767).astype("<i2").tobytes())


def _write_clip(folder: Path, index: int, frames: list[Image.Image], rng: random.Random, audio: bool) -> tuple[str, ...]:
    """Writes clip ``index``: without ``audio`` an mp4 or a gif in turn (its name); with it an mp4 holding its sound,
    or an mp4 and its sound as a .wav, in turn (the names of the video and of the sound)."""
    if not audio:
        name, write = (f"video_{index:03d}.gif", write_gif) if index % 2 else (f"video_{index:03d}.mp4", write_mp4)
        atomic_write(folder / name, lambda temporary: write(temporary, frames))
        return (name,)
    sound, name = example_sound(rng, len(frames) / VIDEO_FPS), f"video_{index:03d}.mp4"
    if index % 2:
        atomic_write(folder / name, lambda temporary: write_mp4(temporary, frames))
        atomic_write(folder / f"audio_{index:03d}.wav", lambda temporary: write_wav(temporary, sound))
        return name, f"audio_{index:03d}.wav"
    atomic_write(folder / name, lambda temporary: write_mp4(temporary, frames, sound=sound))
    return name, name


def build_example_video_dataset(folder: str | os.PathLike, num_videos: int = 2, num_frames: int = 9,
                                size: tuple[int, int] = VIDEO_SIZE, seed: int = 0, audio: bool = False) -> Path:
    """Writes ``num_videos`` clips (mp4 and gif in turn) and ``metadata.csv`` (columns ``video,prompt``); with
    ``audio``, mp4 clips with sound and the column ``input_audio``: the clip itself (its sound track) and a ``.wav``
    beside a silent clip, in turn (the reference's LTX-2 layout).

    Args:
        folder: The dataset folder (``--dataset_base_path``); created if missing, existing files overwritten.
        num_videos: How many clips to draw.
        num_frames: Frames per clip. Train with ``--num_frames`` at most this and of the form 4k+1.
        size: ``(width, height)`` of every clip; both even (the mp4's 4:2:0 colour needs it), 32 to 1024 pixels.
        seed: The same seed writes the same clips and captions (byte for byte with the same PyAV build).
        audio: Give every clip a sound (two tones) and the ``input_audio`` column.

    Returns:
        The metadata file (``--dataset_metadata_path``).

    Raises:
        DatasetError: A count below 1 or an unusable size.
    """
    _check_count("--num_videos", num_videos)
    _check_count("--num_frames", num_frames)
    if (not isinstance(size, tuple) or len(size) != 2
            or not all(isinstance(side, int) and MIN_VIDEO_SIDE <= side <= MAX_VIDEO_SIDE and side % 2 == 0
                       for side in size)):
        raise DatasetError(
            f"video size {size!r} (--width, --height) must be two even integers from {MIN_VIDEO_SIDE} to "
            f"{MAX_VIDEO_SIDE}; the default is {VIDEO_SIZE[0]} x {VIDEO_SIZE[1]}"
        )
    folder = Path(folder)
    rng = random.Random(seed)
    rows = []
    for index in range(num_videos):
        frames, caption = draw_example_video(rng, num_frames, size)
        video, *sound = _write_clip(folder, index, frames, rng, audio)
        rows.append((video, caption, *sound))
    return _write_metadata(folder, "video", rows, ("input_audio",) if audio else ())


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``--output DIR [--kind image|video] [counts, size] [--seed S]``; prints the training flags."""
    parser = argparse.ArgumentParser(description="Write a small procedurally drawn, captioned image or video dataset.")
    parser.add_argument("--output", required=True, help="folder to write the files and metadata.csv into")
    parser.add_argument("--kind", choices=("image", "video"), default="image",
                        help="image: PNG images (Qwen-Image); video: mp4 and gif clips (Wan). Default image")
    parser.add_argument("--num_images", type=int, default=4, help="how many images to draw (default 4)")
    parser.add_argument("--num_videos", type=int, default=2, help="--kind video: how many clips to draw (default 2)")
    parser.add_argument("--num_frames", type=int, default=9, help="--kind video: frames per clip (default 9)")
    parser.add_argument("--width", type=int, default=VIDEO_SIZE[0],
                        help=f"--kind video: clip width in pixels, even (default {VIDEO_SIZE[0]})")
    parser.add_argument("--height", type=int, default=VIDEO_SIZE[1],
                        help=f"--kind video: clip height in pixels, even (default {VIDEO_SIZE[1]})")
    parser.add_argument("--audio", action="store_true",
                        help="--kind video: clips with sound and an input_audio column (LTX-2)")
    parser.add_argument("--seed", type=int, default=0, help="random seed; the same seed writes the same files")
    args = parser.parse_args(argv)
    if args.kind == "video":
        metadata = build_example_video_dataset(args.output, num_videos=args.num_videos, num_frames=args.num_frames,
                                               size=(args.width, args.height), seed=args.seed, audio=args.audio)
        train_frames = f" --num_frames {largest_valid_frame_count(args.num_frames)}"  # what the video VAE accepts
        print(f"wrote {args.num_videos} clips of {args.num_frames} frames and {metadata.name} to {metadata.parent}")
    else:
        metadata = build_example_dataset(args.output, num_images=args.num_images, seed=args.seed)
        train_frames = ""
        print(f"wrote {args.num_images} images and {metadata.name} to {metadata.parent}")
    print(f"train on it with: --dataset_base_path {metadata.parent} --dataset_metadata_path {metadata}{train_frames}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
