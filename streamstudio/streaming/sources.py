"""Frame sources: video files (PyAV), webcams (OpenCV), image folders or globs, a synthetic
moving-shapes pattern, in-memory arrays and (optional extra) screen capture.

Every source yields `VideoFrame`s: an RGB uint8 (H, W, 3) image and its timestamp in seconds
from the first frame. `open_source(spec)` picks one from a string:

    clip.mp4 | frames/ | "frames/*.png" | webcam:0 | pattern | pattern:640x360@30 | screen | screen:1 |
    rtmp://host/app/key (any network stream ffmpeg reads, taken live) |
    ndi://NAME (an NDI source, optional extra: streaming/ndi.py)

`streaming/resample.resample_file(source, fps)` puts a video file at another frame rate; sources
whose frames are made, not read (a generator's clock, camera-path renders), are in
`streaming/generated.py`.
"""

from __future__ import annotations

import glob as globlib
import logging
import math
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from streamstudio.errors import StreamStudioError
from streamstudio.frames import to_rgb

if TYPE_CHECKING:
    import av

    from streamstudio.streaming.ndi import AudioCallback

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff")
MAX_SIDE = 2048  # frames with a longer side are downscaled on input
DEFAULT_FPS = 30.0
MAX_FPS = 1000.0  # input frame rates above this are taken as broken metadata


@dataclass
class VideoFrame:
    image: np.ndarray | None  # (H, W, 3) uint8 RGB; None from a NoInputSource (a generator's clock)
    pts: float  # seconds from the first frame
    index: int


@dataclass
class AudioTrack:
    """Where a source's audio lives, so a sink can remux it (not decoded here)."""

    path: str
    stream_index: int  # index among the container's audio streams
    codec: str
    sample_rate: int
    channels: int
    origin: float  # container time (s) of the first video frame; audio pts are shifted by it
    duration: float | None = None


@dataclass
class SourceInfo:
    width: int
    height: int
    fps: float
    live: bool  # frames arrive in real time (webcam, screen, paced pattern)
    frame_count: int | None = None  # when known in advance
    duration: float | None = None
    audio: AudioTrack | None = None
    rotation: int = 0  # degrees clockwise applied to the decoded frames
    description: str = ""


class Source:
    """Base: `info`, `frames()` (an iterator of VideoFrame, once), `close()`; a context manager.
    `warnings` collects problems that did not stop the source (e.g. a truncated file)."""

    info: SourceInfo

    def __init__(self) -> None:
        self.warnings: list[str] = []

    def frames(self) -> Iterator[VideoFrame]:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------- frame helpers
def to_rgb_frame(image: np.ndarray, max_side: int = MAX_SIDE) -> np.ndarray:
    """Any image `frames.to_rgb` takes -> (H, W, 3) uint8 RGB, downscaled (aspect kept) so that
    its longer side is at most `max_side`."""
    return downscale(to_rgb(image), max_side)


def downscale(image: np.ndarray, max_side: int = MAX_SIDE) -> np.ndarray:
    h, w = image.shape[:2]
    if max(h, w) <= max_side:
        return image
    import cv2

    scale = max_side / max(h, w)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    return cv2.resize(image, size, interpolation=cv2.INTER_AREA)


def rotate(image: np.ndarray, degrees_cw: int) -> np.ndarray:
    """Rotate clockwise by a multiple of 90 degrees."""
    k = (-(degrees_cw // 90)) % 4  # np.rot90 turns counter-clockwise
    return np.ascontiguousarray(np.rot90(image, k)) if k else image


def display_rotation(frame_rotation: float) -> int:
    """Degrees clockwise to turn a decoded frame for display. PyAV's `frame.rotation` is the
    display matrix angle (av_display_rotation_get, counter-clockwise), so players (ffmpeg's
    autorotate) turn the frame clockwise by minus that angle: a phone's portrait clip says -90."""
    return round(-frame_rotation / 90.0) * 90 % 360


def scaled_size(width: int, height: int, max_side: int) -> tuple[int, int]:
    if max(width, height) <= max_side:
        return width, height
    scale = max_side / max(width, height)
    return max(1, round(width * scale)), max(1, round(height * scale))


# ---------------------------------------------------------------------------- video files
class VideoFileSource(Source):
    """Any container/codec PyAV's ffmpeg reads. Timestamps are kept as decoded (variable frame
    rate stays variable) unless they are broken (see `frames`); rotation metadata is applied;
    the audio stream is described for sinks."""

    MIN_STEP_FRACTION = 0.05  # frame steps shorter than this many nominal frame times are broken

    def __init__(self, path: str | Path, max_side: int = MAX_SIDE, live: bool = False, open_timeout: float = 10.0):
        super().__init__()
        import av

        self.url = str(path) if "://" in str(path) else None  # a network stream (rtmp, rtsp, srt, http)
        self.path = self.url or Path(path)
        self.max_side, self.live = max_side, live
        try:
            self._container = av.open(str(self.path), timeout=(open_timeout, open_timeout) if self.url else None)
        except (av.error.FFmpegError, OSError, UnicodeDecodeError) as exc:
            raise StreamStudioError(f"{self.path} is not a readable video ({exc}); "
                                    "give a video file (mp4, mkv, webm, mov, ...), a folder of images "
                                    "or webcam:N") from exc
        if not self._container.streams.video:
            self._container.close()
            raise StreamStudioError(f"{self.path} has no video stream")
        self._stream = self._container.streams.video[0]
        if self._stream.codec_context is None:
            self._container.close()
            raise StreamStudioError(f"{self.path}: its video codec is not one this ffmpeg knows; convert the "
                                    "file to H.264 (mp4) or another common codec")
        self._stream.thread_type = "AUTO"
        self._decoded = self._decode()
        try:
            self._first = self._first_frame()
        except StreamStudioError:
            self._container.close()
            raise
        self.info = self._probe()

    def _probe(self) -> SourceInfo:
        s = self._stream
        # the first plausible rate the file gives (a broken file's average can be 90000 fps)
        rates = [float(r) for r in (s.average_rate, s.guessed_rate, s.base_rate) if r]
        fps = next((r for r in rates if 0 < r <= MAX_FPS), DEFAULT_FPS)
        duration = float(s.duration * s.time_base) if s.duration and s.time_base else None
        if duration is None and self._container.duration:
            duration = self._container.duration / 1_000_000
        width, height = self._first.width, self._first.height
        rotation = display_rotation(self._first.rotation) if self._first.rotation else self._rotation_hint()
        if rotation in (90, 270):
            width, height = height, width
        width, height = scaled_size(width, height, self.max_side)
        name = self.url or Path(self.path).name
        return SourceInfo(width=width, height=height, fps=fps, live=self.live, frame_count=s.frames or None,
                          duration=duration, audio=None if self.live else self._audio_track(), rotation=rotation,
                          description=f"{name} ({s.codec_context.name}, {fps:.3g} fps)")

    def _rotation_hint(self) -> int:
        for key in ("rotate", "rotation"):
            value = self._stream.metadata.get(key)
            if value:
                try:
                    return int(float(value)) % 360
                except ValueError:
                    pass
        return 0

    def _origin(self) -> float:
        """Container time of the first video frame: frame timestamps start there, at 0."""
        if self._first.time is not None:
            return float(self._first.time)
        s = self._stream
        return float(s.start_time * s.time_base) if s.start_time is not None and s.time_base else 0.0

    def _audio_track(self) -> AudioTrack | None:
        """The first audio stream whose codec ffmpeg knows; an audio stream it does not know is
        left out with a warning (the video renders without it)."""
        for index, a in enumerate(self._container.streams.audio):
            codec = getattr(a.codec_context, "name", None) if a.codec_context is not None else None
            if not codec:
                self._warn(f"{self.path}: audio stream {index} has a codec this ffmpeg does not know; "
                           "it is left out of the output")
                continue
            duration = float(a.duration * a.time_base) if a.duration and a.time_base else None
            return AudioTrack(path=str(self.path), stream_index=index, codec=codec,
                              sample_rate=a.codec_context.sample_rate or 0, channels=a.codec_context.channels or 0,
                              origin=self._origin(), duration=duration)
        return None

    def _first_frame(self):
        import av

        try:
            return next(self._decoded)
        except StopIteration:
            raise StreamStudioError(f"{self.path} has a video stream but no frames") from None
        except (av.error.FFmpegError, OSError) as exc:
            raise StreamStudioError(f"{self.path}: cannot decode any frame ({exc}); the file is damaged") from exc

    def frames(self) -> Iterator[VideoFrame]:
        """Frames with their decoded timestamps, from 0. Timestamps that are broken (not strictly
        increasing, steps far shorter than the nominal frame rate's, or past the stream's end) are
        replaced from there on by steps of 1 / the nominal rate, with one warning."""
        import av

        origin, index, frame = None, 0, self._first
        step = 1.0 / self.info.fps
        last, regenerated = None, None  # the last pts handed on; where timestamps were first replaced
        while frame is not None:
            t = frame.time if frame.time is not None else None
            if t is not None and origin is None:
                origin = t
            pts = max(0.0, t - origin) if t is not None else (0.0 if last is None else last + step)
            if last is not None and not self._plausible(pts - last, pts):
                if regenerated is None:
                    regenerated = index
                    self._warn(f"{self.path}: broken frame timestamps from frame {index} on ({pts - last:+.6f} s "
                               f"after the frame before); they are replaced by steps of 1/{self.info.fps:g} s")
                pts = last + step
            last = pts
            yield VideoFrame(self._convert(frame), pts, index)
            index += 1
            try:
                frame = next(self._decoded, None)
            except (av.error.FFmpegError, OSError) as exc:
                self._warn(f"{self.path}: decoding stopped after {index} frame(s) ({exc}); the file looks damaged")
                break
        expected = self.info.frame_count
        if expected and index < expected:
            self._warn(f"{self.path}: {index} of {expected} frame(s) decoded; the file looks truncated")

    def _plausible(self, dt: float, pts: float) -> bool:
        """Whether a frame `dt` seconds after the one before (at `pts` from the first) has a
        timestamp to keep: later than the one before, by more than a small fraction of the nominal
        frame time (variable frame rates stay as they are), and not past the stream's end."""
        if dt <= 0 or dt < self.MIN_STEP_FRACTION / self.info.fps:
            return False
        duration = self.info.duration
        return not duration or pts <= duration + 1.0

    def _warn(self, msg: str) -> None:
        log.warning(msg)
        self.warnings.append(msg)

    def _decode(self):
        for packet in self._container.demux(self._stream):
            if packet.is_corrupt:
                self._warn(f"{self.path}: corrupt packet at {packet.pts}")
            yield from packet.decode()

    def _convert(self, frame: av.VideoFrame) -> np.ndarray:
        """Any pix_fmt (grayscale included) -> (H, W, 3) RGB, downscaled by swscale, then turned."""
        w, h = scaled_size(frame.width, frame.height, self.max_side)
        if (w, h) == (frame.width, frame.height):
            image = frame.to_ndarray(format="rgb24")
        else:
            image = frame.to_ndarray(format="rgb24", width=w, height=h, interpolation="AREA")
        degrees = display_rotation(frame.rotation) if frame.rotation else self.info.rotation
        return rotate(image, degrees)

    def close(self) -> None:
        self._container.close()


# ---------------------------------------------------------------------------- webcam
class WebcamSource(Source):
    """An OpenCV capture device. OpenCV hands over BGR; frames leave here as RGB."""

    def __init__(self, index: int = 0, max_side: int = MAX_SIDE, width: int | None = None,
                 height: int | None = None, fps: float | None = None):
        super().__init__()
        import cv2

        self.index, self.max_side = index, max_side
        self._cap = cv2.VideoCapture(index)
        if not self._cap.isOpened():
            self._cap.release()
            raise StreamStudioError(f"no webcam at index {index} (webcam:{index}); check that a camera is "
                                    "connected and not used by another program, or use --input pattern")
        for prop, value in ((cv2.CAP_PROP_FRAME_WIDTH, width), (cv2.CAP_PROP_FRAME_HEIGHT, height),
                            (cv2.CAP_PROP_FPS, fps)):
            if value:
                self._cap.set(prop, value)
        cam_fps = self._cap.get(cv2.CAP_PROP_FPS) or DEFAULT_FPS
        w, h = int(self._cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(self._cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
        w, h = scaled_size(w or 640, h or 480, max_side)
        self.info = SourceInfo(width=w, height=h, fps=float(cam_fps), live=True, description=f"webcam:{index}")

    def frames(self) -> Iterator[VideoFrame]:
        import cv2

        start, index = None, 0
        while True:
            ok, bgr = self._cap.read()
            if not ok:
                if index == 0:
                    raise StreamStudioError(f"webcam:{self.index} opened but gave no frame")
                self.warnings.append(f"webcam:{self.index} stopped giving frames after {index}")
                return
            now = time.monotonic()
            start = now if start is None else start
            yield VideoFrame(to_rgb_frame(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), self.max_side), now - start, index)
            index += 1

    def close(self) -> None:
        self._cap.release()


# ---------------------------------------------------------------------------- image folder / glob
class ImageSequenceSource(Source):
    """Images in name order, one frame each at `fps`."""

    def __init__(self, files: Sequence[Path], fps: float = DEFAULT_FPS, max_side: int = MAX_SIDE,
                 description: str = ""):
        super().__init__()
        if not files:
            raise StreamStudioError(f"no images ({', '.join(IMAGE_SUFFIXES)}) found in {description or 'the input'}")
        self.files, self.fps, self.max_side = list(files), float(fps), max_side
        first = self._load(self.files[0])
        h, w = first.shape[:2]
        self.info = SourceInfo(width=w, height=h, fps=self.fps, live=False, frame_count=len(self.files),
                               duration=len(self.files) / self.fps,
                               description=description or f"{len(self.files)} images")

    def _load(self, path: Path) -> np.ndarray:
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(path) as im:
                im.draft("RGB", (self.max_side, self.max_side))  # JPEG: decode big images smaller
                return to_rgb_frame(im, self.max_side)  # the one rule: RGBA composited on black
        except (UnidentifiedImageError, OSError) as exc:
            raise StreamStudioError(f"{path} is not a readable image ({exc})") from exc

    def frames(self) -> Iterator[VideoFrame]:
        for i, path in enumerate(self.files):
            yield VideoFrame(self._load(path), i / self.fps, i)


def image_files(spec: str) -> list[Path]:
    path = Path(spec)
    if path.is_dir():
        return sorted(f for f in path.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
    return sorted(Path(f) for f in globlib.glob(spec) if Path(f).suffix.lower() in IMAGE_SUFFIXES)


# ---------------------------------------------------------------------------- synthetic pattern
class PatternSource(Source):
    """Moving shapes over a gradient (demos, tests, benchmarks). `realtime` paces frames at fps."""

    def __init__(self, width: int = 512, height: int = 512, fps: float = DEFAULT_FPS,
                 count: int | None = None, realtime: bool = True):
        super().__init__()
        if width < 1 or height < 1 or fps <= 0:
            raise StreamStudioError(f"pattern size and fps must be positive, got {width}x{height}@{fps}")
        self.width, self.height, self.fps, self.count, self.realtime = width, height, float(fps), count, realtime
        yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
        self._yy, self._xx = yy, xx
        self._bg = np.stack([xx / max(width - 1, 1) * 200, yy / max(height - 1, 1) * 200,
                             np.full_like(xx, 90)], -1).astype(np.uint8)  # (H, W, 3)
        self.info = SourceInfo(width=width, height=height, fps=self.fps, live=realtime, frame_count=count,
                               duration=count / self.fps if count else None,
                               description=f"pattern {width}x{height}@{self.fps:g}")

    def render(self, t: float) -> np.ndarray:
        w, h = self.width, self.height
        img = self._bg.copy()
        r = max(2.0, min(w, h) / 6)
        cx, cy = w * (0.5 + 0.35 * math.cos(t * 1.3)), h * (0.5 + 0.35 * math.sin(t * 1.7))
        img[(self._xx - cx) ** 2 + (self._yy - cy) ** 2 < r * r] = (240, 60, 40)
        sx, sy = (t * w * 0.25) % w, h * 0.5 + 0.3 * h * math.sin(t * 0.9)
        box = (np.abs(self._xx - sx) < r * 0.8) & (np.abs(self._yy - sy) < r * 0.8)
        img[box] = (40, 200, 240)
        return img

    def frames(self) -> Iterator[VideoFrame]:
        start = time.monotonic()
        i = 0
        while self.count is None or i < self.count:
            t = i / self.fps
            if self.realtime:
                delay = start + t - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            yield VideoFrame(self.render(t), t, i)
            i += 1


# ---------------------------------------------------------------------------- in-memory
class ArraySource(Source):
    """Frames already in memory (benchmarks, the web app, tests)."""

    def __init__(self, frames: Sequence[np.ndarray], fps: float = DEFAULT_FPS, live: bool = False,
                 timestamps: Sequence[float] | None = None):
        super().__init__()
        if not len(frames):
            raise StreamStudioError("no frames given")
        self._frames = [to_rgb_frame(f) for f in frames]
        self._pts = list(timestamps) if timestamps is not None else [i / fps for i in range(len(frames))]
        h, w = self._frames[0].shape[:2]
        self.live = live
        self.info = SourceInfo(width=w, height=h, fps=float(fps), live=live, frame_count=len(frames),
                               duration=len(frames) / fps, description=f"{len(frames)} frames in memory")

    def frames(self) -> Iterator[VideoFrame]:
        for i, (image, pts) in enumerate(zip(self._frames, self._pts)):
            yield VideoFrame(image, float(pts), i)


class PushSource(Source):
    """Frames handed over by other code (a WebRTC callback, a WHIP track, a UI) with `put(frame)`,
    which never blocks; live. Keeps the newest `maxsize` frames (older ones are dropped and
    counted); `close()` ends `frames()`. `received` counts the frames put."""

    def __init__(self, width: int, height: int, fps: float = DEFAULT_FPS, maxsize: int = 2,
                 description: str = "pushed frames"):
        super().__init__()
        import threading
        from collections import deque

        self.info = SourceInfo(width=width, height=height, fps=float(fps), live=True, description=description)
        self.received = self.dropped = 0
        self._items: deque = deque(maxlen=max(1, maxsize))
        self._cond = threading.Condition()
        self._closed = False
        self._start: float | None = None

    def put(self, frame: np.ndarray, pts: float | None = None) -> None:
        image = to_rgb_frame(frame)
        with self._cond:
            if self._closed:
                raise StreamStudioError("this input is closed")
            now = time.monotonic()
            self._start = now if self._start is None else self._start
            self.received += 1
            if len(self._items) == self._items.maxlen:
                self.dropped += 1
            self._items.append((image, now - self._start if pts is None else pts))
            self._cond.notify_all()

    def frames(self) -> Iterator[VideoFrame]:
        index = 0
        while True:
            with self._cond:
                while not self._items and not self._closed:
                    self._cond.wait(0.1)
                if not self._items:
                    return
                image, pts = self._items.popleft()
            yield VideoFrame(image, pts, index)
            index += 1

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


# ---------------------------------------------------------------------------- screen (optional)
class ScreenSource(Source):
    """A monitor through mss (optional extra: pip install 'streamstudio[screen]')."""

    def __init__(self, monitor: int = 1, fps: float = DEFAULT_FPS, max_side: int = MAX_SIDE):
        super().__init__()
        try:
            import mss
        except ImportError as exc:
            raise StreamStudioError("screen capture needs mss: pip install 'streamstudio[screen]'") from exc
        try:
            self._sct = mss.mss()
            monitors = self._sct.monitors
        except Exception as exc:  # mss raises its own ScreenShotError without a display
            raise StreamStudioError(f"screen capture is not available here ({exc})") from exc
        if not 0 <= monitor < len(monitors):
            raise StreamStudioError(f"no monitor {monitor}; there are {len(monitors) - 1}")
        self._monitor, self.fps, self.max_side = monitors[monitor], float(fps), max_side
        w, h = scaled_size(self._monitor["width"], self._monitor["height"], max_side)
        self.info = SourceInfo(width=w, height=h, fps=self.fps, live=True, description=f"screen:{monitor}")

    def frames(self) -> Iterator[VideoFrame]:
        start, i = time.monotonic(), 0
        while True:
            delay = start + i / self.fps - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            shot = np.asarray(self._sct.grab(self._monitor))  # (H, W, 4) BGRA
            yield VideoFrame(to_rgb_frame(shot[:, :, 2::-1], self.max_side), time.monotonic() - start, i)
            i += 1

    def close(self) -> None:
        self._sct.close()


class NdiSource(Source):
    """The video of an NDI source (ndi://NAME, `streaming/ndi.py`), live: RGB frames as they come,
    pts from the sender's timecodes (the first frame's at 0); its audio, while `frames()` runs, to
    `on_audio` when one is set (`ndi.AudioCallback`: samples, rate, channels, capture time, timecode).
    Made, it finds the source and reads one frame for its size and rate, then lets go of it;
    `frames()` connects again, so the frames sent before it is asked (while a model loads) are never
    taken, and a recording does not open on a frame held for the load time."""

    FIRST_FRAME_TIMEOUT = 10.0  # seconds for a found source's first frame (its size)
    FRAME_TIMEOUT = 5.0  # seconds without a frame before the source is said to have stopped

    def __init__(self, spec: str, max_side: int = MAX_SIDE, find_timeout: float | None = None):
        super().__init__()
        from streamstudio.streaming.ndi import FIND_TIMEOUT, NdiReceiver

        self.max_side = max_side
        self.on_audio: AudioCallback | None = None
        self.origin: float | None = None  # the sender's timecode (s) of frames()' first frame: pts 0
        self._recv = NdiReceiver(spec, FIND_TIMEOUT if find_timeout is None else find_timeout, connect=False)
        self.name = self._recv.name
        rgb, _, fps = self._first_frame()
        self._recv.disconnect()  # its size and rate known; its frames are taken from frames() on
        w, h = scaled_size(rgb.shape[1], rgb.shape[0], max_side)
        self.info = SourceInfo(width=w, height=h, fps=fps or DEFAULT_FPS, live=True,
                               description=f"ndi://{self.name}")

    def _first_frame(self) -> tuple[np.ndarray, float, float | None]:
        """Connect, and the first frame sent from then on; StreamStudioError when none comes."""
        self._recv.connect()
        first = self._recv.next(self.FIRST_FRAME_TIMEOUT)
        if first is None:
            self.close()
            raise StreamStudioError(f"the NDI source {self.name!r} sent no video within "
                                    f"{self.FIRST_FRAME_TIMEOUT:.0f} s")
        return first

    def frames(self) -> Iterator[VideoFrame]:
        self._recv.on_audio = self.on_audio
        first = self._first_frame()
        index, t0 = 0, first[1]
        self.origin = t0
        item: tuple[np.ndarray, float, float | None] | None = first
        while item is not None:
            rgb, stamp, _ = item
            yield VideoFrame(to_rgb_frame(rgb, self.max_side), stamp - t0, index)
            index += 1
            item = self._recv.next(self.FRAME_TIMEOUT)
        self.warnings.append(f"the NDI source {self.name!r} sent no frame for {self.FRAME_TIMEOUT:.0f} s")

    def close(self) -> None:
        self._recv.close()


# ---------------------------------------------------------------------------- spec parsing
_PATTERN = re.compile(r"^pattern(?::(\d+)x(\d+))?(?:@(\d+(?:\.\d+)?))?$")


def source_kind(spec: str) -> str:
    """What `open_source` opens for `spec`, said without opening anything (the CLI checks an
    input before a model loads): webcam, screen, pattern, stream, images (a folder or glob),
    image or video. An input that does not exist is a StreamStudioError saying what it takes."""
    spec = str(spec).strip()
    if not spec:
        raise StreamStudioError("no input given; use a video file, a folder of images, webcam:N or pattern")
    low = spec.lower()
    if low.startswith("webcam"):
        _index_after(spec, "webcam")
        return "webcam"
    if low.startswith("screen"):
        _index_after(spec, "screen", default=1)
        return "screen"
    if _PATTERN.match(low):
        return "pattern"
    if re.match(r"^(rtmps?|rtsp|srt|udp|tcp|https?)://", low):
        return "stream"
    if low.startswith("ndi://"):
        from streamstudio.streaming.ndi import parse_ndi

        parse_ndi(spec)
        return "ndi"
    path = Path(spec).expanduser()
    if path.is_dir() or any(c in spec for c in "*?["):
        return "images"
    if not path.exists():
        raise StreamStudioError(f"input {spec} does not exist; give a video file, a folder or glob of images, "
                                "webcam:N or pattern")
    return "image" if path.suffix.lower() in IMAGE_SUFFIXES else "video"


def open_source(spec: str, fps: float | None = None, max_side: int = MAX_SIDE, realtime: bool = True) -> Source:
    """A source from its spec: a video file, a folder or glob of images, webcam:N, pattern[:WxH][@fps],
    screen[:N]. Raises StreamStudioError with what to do when it cannot."""
    spec = str(spec).strip()
    kind = source_kind(spec)
    if kind == "webcam":
        return WebcamSource(_index_after(spec, "webcam"), max_side=max_side, fps=fps)
    if kind == "screen":
        return ScreenSource(_index_after(spec, "screen", default=1), fps=fps or DEFAULT_FPS, max_side=max_side)
    if kind == "pattern":
        m = _PATTERN.match(spec.lower())
        assert m is not None  # (source_kind matched it)
        w, h = (int(m.group(1)), int(m.group(2))) if m.group(1) else (512, 512)
        rate = float(m.group(3)) if m.group(3) else (fps or DEFAULT_FPS)
        return PatternSource(w, h, rate, realtime=realtime)
    if kind == "stream":
        return VideoFileSource(spec, max_side=max_side, live=True)
    if kind == "ndi":
        return NdiSource(spec, max_side=max_side)
    path = Path(spec).expanduser()
    if kind == "images":
        return ImageSequenceSource(image_files(str(path)), fps=fps or DEFAULT_FPS, max_side=max_side,
                                   description=spec)
    if kind == "image":
        return ImageSequenceSource([path], fps=fps or DEFAULT_FPS, max_side=max_side, description=spec)
    return VideoFileSource(path, max_side=max_side)


def _index_after(spec: str, prefix: str, default: int = 0) -> int:
    rest = spec[len(prefix):].lstrip(":")
    if not rest:
        return default
    try:
        return int(rest)
    except ValueError as exc:
        raise StreamStudioError(f"bad input {spec!r}: expected {prefix}:N with N a number") from exc


def as_fraction(fps: float) -> Fraction:
    """A frame rate as a small fraction (29.97 -> 30000/1001)."""
    return Fraction(fps).limit_denominator(1001)
