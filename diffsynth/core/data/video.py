"""Video files (Wan): decode with PyAV, keep the first ``--num_frames`` frames, size every frame like an image.

Frame count. The Wan VAE compresses time by 4 and keeps the first frame on its own, so a clip it encodes has 4k+1
frames; ``--num_frames`` must have that form. A video gives its *first* frames, never a sampled subset, so a sample
always shows a continuous stretch of motion at the clip's own frame rate:

- strict (``allow_shorter=False``, the default): the first ``num_frames`` frames; a video with fewer frames is an
  error at dataset construction that names the file, its frame count, the count needed and the fixes. Every sample
  then has the same length, which batching and the trainers' memory planning rely on.
- lenient (``allow_shorter=True``): ``min(num_frames, frames in the video)`` trimmed down to the nearest 4k+1, so a
  10-frame clip gives 9 frames. Samples may then differ in length.

Size. All frames of one video are brought to the size computed from its first frame by the image rule (a fixed
``--height`` x ``--width``, or the clip's aspect ratio under ``--max_pixels`` with sides multiples of 16), with the
same cover-then-centre-crop resize as images. A rotation stored in the stream (phones film portrait clips as rotated
landscape) is applied first, as images get their EXIF orientation.

PyAV is imported only when a video is checked or loaded, so image-only users never pay its import time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from PIL import Image

from .errors import DatasetError

if TYPE_CHECKING:
    from .operators import ResizeConfig

VIDEO_EXTENSIONS = (".mp4", ".gif", ".webm", ".mov", ".mkv")
DEFAULT_NUM_FRAMES = 81
TEMPORAL_COMPRESSION = 4  # the Wan VAE's time stride: latent frames = 1 + (num_frames - 1) / 4
# Display rotation (degrees counter-clockwise, as PyAV reports it) -> the PIL transpose that undoes it.
ROTATIONS = {90: Image.Transpose.ROTATE_90, -90: Image.Transpose.ROTATE_270, 180: Image.Transpose.ROTATE_180,
             -180: Image.Transpose.ROTATE_180}


def is_valid_frame_count(count: Any) -> bool:
    """True for an integer of the form 4k+1 (1, 5, 9, ..., 81)."""
    return isinstance(count, int) and not isinstance(count, bool) and count >= 1 and count % TEMPORAL_COMPRESSION == 1


def largest_valid_frame_count(count: int) -> int:
    """The largest 4k+1 not above ``count``, or 0 when ``count`` is below 1."""
    return (count - 1) // TEMPORAL_COMPRESSION * TEMPORAL_COMPRESSION + 1 if count >= 1 else 0


def check_num_frames(num_frames: Any) -> None:
    """Rejects a ``--num_frames`` that is not a positive 4k+1 integer, suggesting the nearest valid count."""
    if is_valid_frame_count(num_frames):
        return
    if isinstance(num_frames, int) and not isinstance(num_frames, bool) and num_frames > 1:
        below = largest_valid_frame_count(num_frames)
        suggestion = f"--num_frames {below} or {below + TEMPORAL_COMPRESSION}"
    else:
        suggestion = f"--num_frames {DEFAULT_NUM_FRAMES}"
    raise DatasetError(
        f"--num_frames {num_frames!r} must be an integer of the form 4k+1 (1, 5, 9, ..., 49, 81): the video VAE "
        f"compresses time by 4 and keeps the first frame apart; pass {suggestion}"
    )


class VideoInfo(NamedTuple):
    """What a container's header and packet index say about its first video stream, and, when its first frame was
    decoded, the size it is shown at (its stored rotation applied, which only a decoded frame reveals)."""

    width: int
    height: int
    frames: int
    shown: tuple[int, int] | None = None


VIDEO_PROBES_REMEMBERED = 200_000
"""Video probes ``file_memo`` keeps (a few hundred bytes each): a bucketed run's start-up check reads each video once,
and bucketing takes its shape from that read."""


def _import_av() -> Any:
    try:
        import av
    except ImportError as error:
        raise ImportError(
            "loading video files needs PyAV, which is missing; install it with `pip install -c constraints.txt av` "
            "(it is among diffsynth's dependencies), or remove the video column from --data_file_keys"
        ) from error
    return av


def _reason(error: Exception) -> str:
    """PyAV's message without the file name it appends, which the caller's message already names."""
    return getattr(error, "strerror", None) or str(error)


def _unreadable(path: Path, reason: str) -> DatasetError:
    return DatasetError(
        f"{path} is not a video PyAV can read ({reason}); replace the file (re-encode it, e.g. with "
        "`ffmpeg -i in -c:v libx264 out.mp4`) or remove its row from the metadata"
    )


def probe_video(path: Path, stop_at: int | None = None, shown: bool = False) -> VideoInfo:
    """Reads the size and frame count of the first video stream, in one opening of the file.

    The count comes from the container header when it stores one (mp4, mov, gif); otherwise (webm, mkv) packets are
    demuxed and counted, which reads the file but costs far less than decoding it. Only ``shown`` decodes a frame.

    Args:
        path: The video file.
        stop_at: Stop counting packets at this many; callers that only need "at least N" save reading long clips.
        shown: Also decode the first frame, for the size it is shown at (``VideoInfo.shown``).

    Raises:
        DatasetError: The file is not a container PyAV opens, or holds no video stream or no frame.
    """
    av = _import_av()
    shown_size = None
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise _unreadable(path, "it holds no video stream")
            stream = container.streams.video[0]
            width, height = stream.codec_context.width, stream.codec_context.height
            frames = stream.frames
            if frames > 0 and shown:
                shown_size = _shown_size(next(container.decode(stream), None))
            elif frames <= 0:
                frames = 0
                for packet in container.demux(stream):
                    frames += packet.size > 0  # the demuxer ends the stream with an empty flush packet
                    if shown and shown_size is None:  # the flush packet also yields a decoder's delayed frames
                        shown_size = _shown_size(next(iter(packet.decode()), None))
                    if stop_at is not None and frames >= stop_at and (shown_size is not None or not shown):
                        break
    except (av.FFmpegError, OSError) as error:
        raise _unreadable(path, _reason(error)) from error
    if frames <= 0 or width <= 0 or height <= 0:
        raise _unreadable(path, f"its video stream has {frames} frames of {width}x{height} pixels")
    if shown and shown_size is None:
        raise _unreadable(path, "no frame of its video stream decodes")
    return VideoInfo(width, height, frames, shown_size)


def _shown_size(frame: Any) -> tuple[int, int] | None:
    """``(width, height)`` of a decoded frame as displayed; None for no frame."""
    if frame is None:
        return None
    return (frame.height, frame.width) if frame.rotation in (90, -90) else (frame.width, frame.height)


def read_video_probe(path: Path, stop_at: int | None, shown: bool) -> VideoInfo:
    """``probe_video``, read once while the file is unchanged (``file_memo``)."""
    from ..file_memo import parsed

    return parsed(path, f"video probe {stop_at} {shown}", lambda file: probe_video(file, stop_at, shown),
                  limit=VIDEO_PROBES_REMEMBERED)


@dataclass(frozen=True)
class LoadVideo:
    """The video operator's settings, validated at construction, and its check and load steps.

    Attributes:
        num_frames: Frames per sample (``--num_frames``), of the form 4k+1. More frames cost linearly more VAE and
            quadratically more DiT attention memory.
        allow_shorter: Trim a video shorter than ``num_frames`` to its largest 4k+1 frame count instead of rejecting
            it. Off by default so every sample has the same length.
    """

    num_frames: int = DEFAULT_NUM_FRAMES
    allow_shorter: bool = False

    def __post_init__(self) -> None:
        check_num_frames(self.num_frames)
        if not isinstance(self.allow_shorter, bool):
            raise DatasetError(f"allow_shorter={self.allow_shorter!r} must be True or False")

    def frames_to_take(self, available: int, path: str | os.PathLike) -> int:
        """How many leading frames a video with ``available`` frames gives (see the module docstring).

        Raises:
            DatasetError: Strict mode and fewer than ``num_frames`` frames; the message names the file, both counts
                and the fixes.
        """
        if available >= self.num_frames:
            return self.num_frames
        if self.allow_shorter and available >= 1:
            return largest_valid_frame_count(available)
        fit = largest_valid_frame_count(available)
        fixes = f"pass --num_frames {fit} (the largest 4k+1 count it has), " if fit else ""
        raise DatasetError(
            f"video {path} has {available} frames, fewer than the {self.num_frames} that --num_frames asks for; "
            f"{fixes}use a clip with at least {self.num_frames} frames, remove its row from the metadata, or let "
            "shorter videos be trimmed (--allow_shorter_videos)"
        )

    def check(self, path: Path, resize: ResizeConfig) -> int:
        """Checks ``path`` from its header and packet index only: readable, long enough, and a non-empty size.

        Returns:
            The pixels ``load`` decodes: frames taken x width x height (lenient mode counts up to ``num_frames``,
            since it stops counting packets early).
        """
        # Counting stops once the frames needed are there; strict mode needs them all, lenient mode only one, except
        # under buckets, whose shape (``shape``, from this same read) needs the count and the size as shown.
        info = read_video_probe(path, *self._probe_settings(resize.buckets))
        frames = self.num_frames if self.allow_shorter else self.frames_to_take(info.frames, path)
        # A stored rotation swaps width and height, which cannot change whether a side rounds down to 0.
        resize.target_size(info.width, info.height, source=path, kind="video")
        return frames * info.width * info.height

    def load(self, path: Path, resize: ResizeConfig) -> list[Image.Image]:
        """Decodes the leading frames of ``path`` as RGB images, all of one size.

        Decoding stops after ``num_frames`` frames, so a long clip costs only the frames used.

        Raises:
            DatasetError: The file cannot be decoded, or decodes to fewer frames than its header promised and than
                strict mode needs (a truncated file).
        """
        from .operators import resize_and_crop  # operators.py imports this module to register VIDEO_OPERATOR

        av = _import_av()
        frames = []
        rotation = 0
        try:
            with av.open(str(path)) as container:
                if not container.streams.video:
                    raise _unreadable(path, "it holds no video stream")
                stream = container.streams.video[0]
                stream.thread_type = "AUTO"  # frame threads: several times faster on long clips, same pixels
                for frame in container.decode(stream):
                    if not frames:
                        rotation = frame.rotation
                    frames.append(frame.to_image())  # to_image converts any pixel format to RGB
                    if len(frames) == self.num_frames:
                        break
        except (av.FFmpegError, OSError) as error:
            raise DatasetError(
                f"could not decode video {path} after {len(frames)} frames ({_reason(error)}); the file may be "
                "truncated: replace it or remove its row"
            ) from error
        try:
            frames = frames[:self.frames_to_take(len(frames), path)]
        except DatasetError as error:
            raise DatasetError(f"{error}. If its header claims more frames, the file is truncated") from error
        transpose = ROTATIONS.get(rotation)
        if transpose is not None:
            frames = [frame.transpose(transpose) for frame in frames]
        target = resize.target_size(*frames[0].size, source=path, kind="video")
        return [resize_and_crop(frame, *target) for frame in frames]


    def shape(self, path: Path, resize: ResizeConfig) -> tuple[int, int, int]:
        """The ``(width, height, frames)`` ``load`` gives ``path``: the size from its first frame as displayed (its
        stored rotation applied, which only decoding that frame reveals), the frames from its packet index; the
        reading a bucketed dataset's ``check`` made, while the file is unchanged."""
        info = read_video_probe(path, *self._probe_settings(shape=True))
        frames = self.frames_to_take(info.frames, path) if self.allow_shorter else self.num_frames
        return (*resize.target_size(*info.shown, source=path, kind="video"), frames)

    def _probe_settings(self, shape: bool) -> tuple[int, bool]:
        """``(stop_at, shown)`` of the probe ``check`` needs; with ``shape`` also what ``shape`` needs."""
        return (self.num_frames if shape or not self.allow_shorter else 1), shape


def check_video(path: Path, resize: ResizeConfig, num_frames: int = DEFAULT_NUM_FRAMES,
                allow_shorter: bool = False) -> int:
    """The operator-table form of ``LoadVideo(num_frames, allow_shorter).check(path, resize)``."""
    return LoadVideo(num_frames, allow_shorter).check(path, resize)


def load_video(path: Path, resize: ResizeConfig, num_frames: int = DEFAULT_NUM_FRAMES,
               allow_shorter: bool = False) -> list[Image.Image]:
    """The operator-table form of ``LoadVideo(num_frames, allow_shorter).load(path, resize)``."""
    return LoadVideo(num_frames, allow_shorter).load(path, resize)


def video_shape(path: Path, resize: ResizeConfig, num_frames: int = DEFAULT_NUM_FRAMES,
                allow_shorter: bool = False) -> tuple[int, int, int]:
    """The operator-table form of ``LoadVideo(num_frames, allow_shorter).shape(path, resize)``."""
    return LoadVideo(num_frames, allow_shorter).shape(path, resize)
