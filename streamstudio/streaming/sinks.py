"""Frame sinks: video files (mp4/mkv/webm/mov, source audio remuxed), image sequences, RTMP
push, HLS, a virtual camera (optional extra) and a null sink.

`open_sink(spec, width, height, fps, audio_from=None)` picks one from a string (the RTMP sink is
in `streaming/rtmp.py`, the base class `Sink` and the shared encoder in `streaming/sink_base.py`):

    out.mp4 | out.mkv | out.webm | frames/ | "frames/%05d.png" | rtmp://host/app/key |
    hls:DIR | DIR/index.m3u8 | virtualcam | ndi://NAME (an NDI source: streaming/ndi.py) | null

Every sink takes RGB uint8 (H, W, 3) frames through `write(frame, pts_seconds)`, keeps a
`status` (frames written, lost, reconnects, last error) and is closed by `close()`, after
which a file output is complete and playable. Frames are padded to even sizes for yuv420p,
and resized when they differ from the size the sink was opened with.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from streamstudio.errors import StreamStudioError
from streamstudio.frames import fit
from streamstudio.streaming.rtmp import RtmpConfig, RtmpSink
from streamstudio.streaming.sink_base import Sink, VideoEncoder, x264_options
from streamstudio.streaming.sources import IMAGE_SUFFIXES, AudioTrack

if TYPE_CHECKING:
    import av
    from av.container import OutputContainer

log = logging.getLogger(__name__)

VIDEO_CODECS = {".mp4": "libx264", ".mov": "libx264", ".mkv": "libx264", ".webm": "libvpx-vp9", ".flv": "libx264"}
# audio codecs each container takes as they are (others are re-encoded to the first one listed)
AUDIO_OK = {
    ".mp4": ("aac", "mp3", "alac", "ac3", "eac3", "opus", "flac"),
    ".mov": ("aac", "mp3", "alac", "ac3", "pcm_s16le"),
    ".mkv": ("aac", "opus", "vorbis", "mp3", "flac", "ac3", "eac3", "pcm_s16le", "alac"),
    ".webm": ("opus", "vorbis"),
    ".flv": ("aac", "mp3"),
}


def make_output_folder(folder: str | Path, what: str = "output") -> Path:
    """Create `folder` (and its parents) for an output and check that files can be made in it;
    a folder that cannot be made or written (a parent is a file, a read-only or virtual file
    system, no permission) is a StreamStudioError naming it."""
    import tempfile

    folder = Path(folder)
    hint = "give an output in a folder that can be written"
    for above in (folder, *folder.parents):
        if above.exists():
            if not above.is_dir():
                raise StreamStudioError(f"cannot write the {what} into {folder}: {above} is a file, not a folder; "
                                        f"{hint}")
            break
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder, prefix=".streamstudio-"):
            pass
    except OSError as exc:
        raise StreamStudioError(f"cannot write the {what} into the folder {folder} ({exc.strerror or exc}); "
                                f"{hint}") from exc
    return folder


def output_error(path: str | Path, exc: BaseException) -> StreamStudioError:
    """The error for an output file that cannot be opened for writing."""
    why = getattr(exc, "strerror", None) or str(exc)
    return StreamStudioError(f"cannot write {path} ({why}); check that its folder {Path(path).parent} "
                             "exists and can be written")


class NullSink(Sink):
    """Discards frames (benchmarks, dry runs); keeps the last one."""

    last: np.ndarray | None = None

    def write(self, frame: np.ndarray, pts: float | None = None) -> None:
        self.last = frame
        self.status.frames_written += 1


# ---------------------------------------------------------------------------- files, image sequences, HLS
def _vp9_options(fps: float) -> dict[str, str]:
    return {"deadline": "realtime", "cpu-used": "8", "row-mt": "1", "crf": "32", "b": "0",
            "g": str(max(1, round(fps)))}


class _AudioPassthrough:
    """Copies the source's audio packets into the output, shifted to the first video frame,
    interleaved with the video; re-encodes only when the container cannot hold the codec."""

    def __init__(self, track: AudioTrack, container: OutputContainer, suffix: str):
        import av

        self.track = track
        self._in = av.open(track.path)
        self._in_stream = self._in.streams.audio[track.stream_index]
        self.copy = track.codec in AUDIO_OK.get(suffix, ())
        self._negative_ok = suffix in (".mp4", ".mov")
        if self.copy:
            self.stream = container.add_stream_from_template(self._in_stream)
        else:
            target = AUDIO_OK.get(suffix, ("aac",))[0]
            rate = 48000 if target == "opus" else (track.sample_rate or 48000)
            stream = container.add_stream(target, rate=rate)
            if not isinstance(stream, av.AudioStream):
                raise StreamStudioError(f"{target} is not an audio codec")
            self.stream = stream
            self.stream.layout = "stereo" if track.channels != 1 else "mono"
            self._resampler = av.AudioResampler(format=self.stream.format.name if self.stream.format else "fltp",
                                                layout=self.stream.layout.name, rate=rate)
            log.info("audio %s cannot go into %s as is; re-encoding to %s", track.codec, suffix, target)
        self._packets = self._in.demux(self._in_stream)
        self._pending: av.Packet[av.AudioStream] | None = None
        self._done = self._flushed = False

    def mux_until(self, container: OutputContainer, t_end: float | None) -> None:
        """Mux source audio starting before t_end seconds (all of it when None)."""
        while not self._done:
            packet = self._pending or next(self._packets, None)
            self._pending = None
            if packet is None:
                self._done = True
                break
            stamp = packet.pts if packet.pts is not None else packet.dts
            if stamp is None:
                continue
            start = float(stamp * packet.time_base) - self.track.origin
            if t_end is not None and start >= t_end:
                self._pending = packet
                return
            if self.copy and not self._negative_ok and start + float((packet.duration or 0) * packet.time_base) <= 0:
                continue  # encoder priming before the first frame: only mp4/mov edit lists can hold it
            self._mux(container, packet, start)
        if self._done:
            self._flush(container)

    def _mux(self, container: OutputContainer, packet: av.Packet[av.AudioStream], start: float) -> None:
        if not self.copy:
            for frame in packet.decode():
                frame.pts = None
                for rf in self._resampler.resample(frame):
                    self._encode_frames(container, rf)
            return
        shift = round(self.track.origin / packet.time_base)
        if packet.pts is not None:
            packet.pts -= shift
        if packet.dts is not None:
            packet.dts -= shift
        packet.stream = self.stream
        container.mux(packet)

    def _encode_frames(self, container: OutputContainer, frame: av.AudioFrame | None) -> None:
        for packet in self.stream.encode(frame):
            container.mux(packet)

    def _flush(self, container: OutputContainer) -> None:
        if not self.copy and not self._flushed:
            self._flushed = True
            self._encode_frames(container, None)

    def stop(self, container: OutputContainer, t_end: float) -> None:
        """Mux what starts before the video's end, then the encoder's tail when re-encoding."""
        self.mux_until(container, t_end)
        self._flush(container)

    def close(self) -> None:
        self._in.close()


class FileSink(Sink):
    """mp4 / mov / mkv (H.264) or webm (VP9) through PyAV, with the source's audio kept. The
    video is written to a hidden file beside `path` (`.NAME.partial.SUFFIX`) and moved into place
    at close: a file already at `path` stays whole until the new one is complete, and a sink
    closed with no frame leaves nothing."""

    def __init__(self, path: str | Path, width: int, height: int, fps: float, audio_from: AudioTrack | None = None):
        super().__init__(str(path), width, height, fps)
        import av

        self.path = Path(path)
        suffix = self.path.suffix.lower()
        if suffix not in VIDEO_CODECS:
            raise StreamStudioError(f"cannot write {self.path.suffix or 'files without a suffix'}; "
                                    f"use one of {', '.join(VIDEO_CODECS)}")
        make_output_folder(self.path.parent)
        if self.path.is_dir():
            raise StreamStudioError(f"cannot write {self.path}: it is a folder; give a file name for the video")
        self.partial = self.path.with_name(f".{self.path.stem}.partial{suffix}")
        try:
            self._container = av.open(str(self.partial), "w")
        except (av.error.FFmpegError, OSError) as exc:
            raise output_error(self.path, exc) from exc
        codec = VIDEO_CODECS[suffix]
        opts = _vp9_options(fps) if codec == "libvpx-vp9" else x264_options(fps, live=False)
        self._enc = VideoEncoder(self._container, codec, width, height, fps, opts)
        self._audio = None
        if audio_from is not None:
            try:
                self._audio = _AudioPassthrough(audio_from, self._container, suffix)
            except (av.error.FFmpegError, OSError, ValueError) as exc:
                log.warning("audio of %s not kept: %s", audio_from.path, exc)
        self._lock = threading.Lock()

    def write(self, frame: np.ndarray, pts: float | None = None) -> None:
        with self._lock:
            if self.status.closed:
                raise StreamStudioError(f"{self.path} is already closed")
            pts = self.status.frames_written / self.fps if pts is None else pts
            self._enc.write(frame, pts)
            if self._audio is not None:
                self._audio.mux_until(self._container, pts)  # audio up to this frame; the rest at close
            self.status.frames_written += 1

    def close(self) -> None:
        with self._lock:
            if self.status.closed:
                return
            self.status.closed = True
            try:
                self._enc.flush()
                if self._audio is not None:
                    self._audio.stop(self._container, self._enc.end_time())
            finally:
                if self._audio is not None:
                    self._audio.close()
                self._container.close()
                if self.status.frames_written:
                    os.replace(self.partial, self.path)  # (atomic on one file system)
                else:
                    self.partial.unlink(missing_ok=True)


class ImageSequenceSink(Sink):
    """One PNG (or JPEG, ...) per frame: DIR/frame_000000.png or a printf pattern; or, given
    `names`, frame i as DIR/names[i] (generate keeps its inputs' names)."""

    def __init__(self, spec: str, width: int, height: int, fps: float, names: Sequence[str] | None = None):
        super().__init__(spec, width, height, fps)
        self.names = None if names is None else list(names)
        if self.names is not None:
            self.folder = make_output_folder(spec)
            return
        if "%" in spec:
            self.pattern = spec
            make_output_folder(Path(spec).parent)
        else:
            make_output_folder(spec)
            self.pattern = str(Path(spec) / "frame_%06d.png")
        try:
            self.pattern % 0
        except (TypeError, ValueError) as exc:
            raise StreamStudioError(f"bad image-sequence pattern {spec!r}; use e.g. frames/%05d.png") from exc

    def write(self, frame: np.ndarray, pts: float | None = None) -> None:
        from PIL import Image

        Image.fromarray(fit(frame, self.width, self.height)).save(self._path(self.status.frames_written))
        self.status.frames_written += 1

    def _path(self, index: int) -> str:
        if self.names is None:
            return self.pattern % index
        if index >= len(self.names):
            raise StreamStudioError(f"{self.spec}: frame {index + 1} has no name ({len(self.names)} given)")
        return str(self.folder / self.names[index])


class HlsSink(Sink):
    """HLS: DIR/index.m3u8 and DIR/segment_00000.ts (H.264, a keyframe each second)."""

    def __init__(self, directory: str | Path, width: int, height: int, fps: float, segment_seconds: float = 2.0,
                 window: int = 0):
        super().__init__(str(directory), width, height, fps)
        import av

        self.directory = make_output_folder(directory, "HLS output")
        self.playlist = self.directory / "index.m3u8"
        options = {"hls_time": f"{segment_seconds:g}", "hls_list_size": str(window),
                   "hls_segment_filename": str(self.directory / "segment_%05d.ts")}
        options["hls_flags"] = "delete_segments+independent_segments" if window else "independent_segments"
        if not window:
            options["hls_playlist_type"] = "event"
        try:
            self._container = av.open(str(self.playlist), "w", format="hls", options=options)
        except (av.error.FFmpegError, OSError) as exc:
            raise StreamStudioError(f"cannot write HLS into {self.directory}: {exc}") from exc
        self._enc = VideoEncoder(self._container, "libx264", width, height, fps, x264_options(fps, live=True))

    def write(self, frame: np.ndarray, pts: float | None = None) -> None:
        pts = self.status.frames_written / self.fps if pts is None else pts
        self._enc.write(frame, pts)
        self.status.frames_written += 1

    def close(self) -> None:
        if self.status.closed:
            return
        self.status.closed = True
        try:
            self._enc.flush()
        finally:
            self._container.close()


# ---------------------------------------------------------------------------- virtual camera (optional)
class VirtualCameraSink(Sink):
    """A virtual webcam through pyvirtualcam (optional extra: pip install 'streamstudio[virtualcam]')."""

    def __init__(self, width: int, height: int, fps: float, device: str | None = None):
        super().__init__("virtualcam", width, height, fps)
        try:
            import pyvirtualcam
        except ImportError as exc:
            raise StreamStudioError("the virtual camera needs pyvirtualcam: "
                                    "pip install 'streamstudio[virtualcam]'") from exc
        try:
            self._cam = pyvirtualcam.Camera(width=width, height=height, fps=fps, device=device,
                                            fmt=pyvirtualcam.PixelFormat.RGB)
        except Exception as exc:  # pyvirtualcam raises RuntimeError when no backend is installed
            raise StreamStudioError(f"no virtual camera available ({exc}); install v4l2loopback (Linux), "
                                    "OBS (Windows/macOS)") from exc

    def write(self, frame: np.ndarray, pts: float | None = None) -> None:
        self._cam.send(fit(frame, self.width, self.height))
        self.status.frames_written += 1

    def close(self) -> None:
        if not self.status.closed:
            self.status.closed = True
            self._cam.close()


class NdiSink(Sink):
    """Frames out as an NDI source (ndi://NAME, `streaming/ndi.py`), each frame's pts as its NDI
    timecode."""

    def __init__(self, spec: str, width: int, height: int, fps: float):
        super().__init__(spec, width, height, fps)
        from streamstudio.streaming.ndi import NdiSender

        self._sender = NdiSender(spec, fps)
        self.name = self._sender.name

    def write(self, frame: np.ndarray, pts: float | None = None) -> None:
        self._sender.send(fit(frame, self.width, self.height), pts)
        self.status.frames_written += 1

    def close(self) -> None:
        if not self.status.closed:
            self.status.closed = True
            self._sender.close()


# ---------------------------------------------------------------------------- spec parsing
def sink_kind(spec: str) -> str:
    """What `open_sink` opens for `spec`, said without opening anything (the CLI checks an
    output before a model loads): rtmp, hls, virtualcam, null, file or images. A spec it cannot
    open is a StreamStudioError saying what it takes."""
    spec = str(spec).strip()
    low = spec.lower()
    if not spec:
        raise StreamStudioError("no output given; use a video file, a folder, rtmp://... or hls:DIR")
    if low.startswith(("rtmp://", "rtmps://")):
        return "rtmp"
    if low.startswith("ndi://"):
        from streamstudio.streaming.ndi import parse_ndi

        parse_ndi(spec)
        return "ndi"
    if low.startswith("hls:") or low.endswith(".m3u8"):
        return "hls"
    if low in ("virtualcam", "vcam") or low.startswith("virtualcam:"):
        return "virtualcam"
    if low == "null":
        return "null"
    suffix = Path(spec).suffix.lower()
    if suffix in VIDEO_CODECS:
        return "file"
    if suffix and suffix not in IMAGE_SUFFIXES:
        raise StreamStudioError(f"unknown output {spec!r} (a {suffix} file); use .mp4, .mkv, .webm, .mov, a folder, "
                                "frames/%05d.png, rtmp://..., hls:DIR or null")
    return "images"


def check_not_input(output: str | Path, inputs: Iterable[str | Path | None]) -> None:
    """An output that would overwrite one of `inputs` (the same file, or a frame pattern or
    folder holding it) is refused before anything is written: a render never destroys what it reads."""
    out = Path(os.path.expanduser(str(output)))
    for spec in inputs:
        if not spec:
            continue
        src = Path(os.path.expanduser(str(spec)))
        if not src.exists():
            continue
        same = out.exists() and os.path.samefile(out, src)
        if same or out.resolve() == src.resolve():
            raise StreamStudioError(f"the output {output} is the input {spec}: writing it would destroy the input; "
                                    "give another --output")


def open_sink(spec: str, width: int, height: int, fps: float, audio_from: AudioTrack | None = None,
              rtmp: RtmpConfig | None = None) -> Sink:
    """A sink from its spec (see the module docstring); raises StreamStudioError when it cannot.
    `rtmp` sets an RTMP output's timeouts and reconnects."""
    spec = str(spec).strip()
    kind = sink_kind(spec)
    if kind == "rtmp":
        return RtmpSink(spec, width, height, fps, rtmp)
    if kind == "hls":
        return HlsSink(spec[4:] if spec.lower().startswith("hls:") else Path(spec).parent, width, height, fps)
    if kind == "virtualcam":
        return VirtualCameraSink(width, height, fps, device=spec.split(":", 1)[1] if ":" in spec else None)
    if kind == "ndi":
        return NdiSink(spec, width, height, fps)
    if kind == "null":
        return NullSink(spec, width, height, fps)
    if kind == "file":
        return FileSink(spec, width, height, fps, audio_from=audio_from)
    return ImageSequenceSink(spec, width, height, fps)
