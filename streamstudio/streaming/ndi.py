"""NDI in and out: the video-over-IP that live-production tools exchange (TouchDesigner, OBS with
its NDI plugin, vMix, Resolume), through `ndi-python` (an optional extra: pip install
'streamstudio[ndi]'; its wheel carries the NDI runtime, under the NDI SDK licence).

    ndi://NAME                 the source or sender called NAME; a source's full NDI name is
                               "HOST (NAME)": NAME alone finds it on any host, "HOST (NAME)" on one
    ndi://NAME?ips=A,B         also look for sources at these addresses (where multicast
                               discovery does not reach: other subnets, containers)

`NdiReceiver` takes a sender's video (RGBX, as the runtime converts it) as RGB frames with the
sender's timecodes, and hands its audio (planar float32) to `on_audio` when one is given, stamped
with its capture time (`audio_captured`), only while it is connected (`connect`, `disconnect`: a source is found and
measured before a model loads, and its frames taken once the model is ready); `NdiSender` sends
RGB frames as an NDI source (RGBX), each with its time in the stream as the NDI timecode (100 ns
units; never the clock at send time), advertising the frame rate those times measure. The frame
API over them: `streaming.sources.NdiSource` and `streaming.sinks.NdiSink` (this module imports
neither). Discovery also asks 127.0.0.1, so a sender and a receiver on one machine find each
other without multicast.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from fractions import Fraction
from typing import Any
from urllib.parse import parse_qs, urlparse

import numpy as np

from streamstudio.errors import StreamStudioError

FIND_TIMEOUT = 10.0  # seconds a source is looked for
FIND_ROUND = 2.0  # seconds one finder looks before a new one asks the addresses again
TICKS = 10_000_000  # NDI times are in 100 ns units
RATE_WINDOW = 30  # frames whose times measure the rate a sender advertises
RATE_MIN_FRAMES = 5  # frames sent before a measured rate is advertised (the configured one until then)
RATE_CHANGE = 0.02  # the advertised rate follows a measured one that differs by more than 2 %
# broadcast rates (NTSC's 1000/1001 ones too): a measured rate within 0.5 % of one is advertised as it
TIMESTAMP_UNDEFINED = 2**63 - 1  # NDIlib_recv_timestamp_undefined: a sender that gave no timestamp
MAX_CLOCK_SKEW_S = 1.0  # a sender's timestamp further than this from the arrival is another clock's: not believed
STANDARD_RATES = tuple(Fraction(n * k, d) for n in (24, 25, 30, 48, 50, 60, 120)
                       for k, d in ((1, 1), (1000, 1001)) if not (n in (25, 50) and d == 1001))


def _ndi():
    try:
        import NDIlib
    except ImportError as exc:
        raise StreamStudioError("NDI needs ndi-python: pip install 'streamstudio[ndi]'") from exc
    if not NDIlib.initialize():
        raise StreamStudioError("the NDI runtime did not start (NDI needs a CPU with SSE4.2)")
    return NDIlib


def parse_ndi(spec: str) -> tuple[str, list[str]]:
    """(name, extra addresses) of an ndi:// spec."""
    url = urlparse(str(spec).strip())
    if url.scheme.lower() != "ndi":
        raise StreamStudioError(f"not an NDI address: {spec!r} (ndi://NAME)")
    name = (url.netloc + url.path).strip("/")
    name = name.replace("%20", " ")
    if not name or len(name) > 200:
        raise StreamStudioError(f"ndi://NAME needs a source name of 1 to 200 characters, got {spec!r}")
    ips = [ip for value in parse_qs(url.query).get("ips", []) for ip in value.split(",") if ip.strip()]
    return name, ips


def _matches(full_name: str, name: str) -> bool:
    """NAME matches "HOST (NAME)"; "HOST (NAME)" matches itself."""
    return full_name == name or (full_name.endswith(f"({name})") and "(" in full_name)


def find_source(name: str, ips: list[str] | None = None, timeout: float = FIND_TIMEOUT) -> Any:  # an NDIlib.Source
    """The NDI source called `name`, found within `timeout` s; StreamStudioError naming the ones seen.
    The finder is made again every FIND_ROUND s: one asks the extra addresses when it starts, so a
    sender that appears later is found by the next."""
    ndi = _ndi()
    settings = ndi.FindCreate()
    settings.show_local_sources = True
    settings.extra_ips = ",".join(["127.0.0.1", *(ips or [])])
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        finder = ndi.find_create_v2(settings)
        if finder is None:
            raise StreamStudioError("the NDI runtime could not start looking for sources")
        try:
            round_end = min(deadline, time.monotonic() + FIND_ROUND)
            while time.monotonic() < round_end:
                ndi.find_wait_for_sources(finder, 250)
                sources = ndi.find_get_current_sources(finder)
                seen = [s.ndi_name for s in sources]
                for source in sources:
                    if _matches(source.ndi_name, name):
                        found = ndi.Source()
                        found.ndi_name, found.url_address = source.ndi_name, source.url_address
                        return found
        finally:
            ndi.find_destroy(finder)
    raise StreamStudioError(f"no NDI source {name!r} within {timeout:.0f} s; seen: {', '.join(seen) or 'none'} "
                            "(on another subnet: ndi://NAME?ips=ADDRESS)")


def frame_rate(fps: float) -> tuple[int, int]:
    """(frame_rate_N, frame_rate_D) of a rate in frames a second: a broadcast rate within 0.5 %
    exactly (29.97 -> 30000/1001), any other to 1/1000 fps (7.5 -> 15/2)."""
    fps = float(fps)
    if not (math.isfinite(fps) and fps > 0):
        raise StreamStudioError(f"an NDI frame rate must be a positive number, got {fps!r}")
    near = min(STANDARD_RATES, key=lambda r: abs(fps - r))
    rate = near if abs(fps - near) <= 0.005 * near else Fraction(max(1, round(fps * 1000)), 1000)
    return rate.numerator, rate.denominator


def audio_samples(frame: Any) -> tuple[np.ndarray, int, int]:  # an NDIlib.AudioFrameV2 or V3
    """An NDI audio frame (audio_frame_v2/v3: planar float32, each channel's plane
    channel_stride_in_bytes after the last) as (samples interleaved float32, sample rate, channels)."""
    channels, n = max(1, int(frame.no_channels)), int(frame.no_samples)
    data = np.asarray(frame.data, dtype=np.float32)
    if data.ndim == 1:  # the raw buffer: planes a stride apart (a stride of 0: packed)
        stride = int(frame.channel_stride_in_bytes) // 4 or n
        data = data[:channels * stride].reshape(channels, stride)
    planes = data[:channels, :n]  # (channels, samples)
    return np.ascontiguousarray(planes.T).reshape(-1), int(frame.sample_rate), channels


def audio_captured(frame: Any, arrival: float, wall: float) -> float:
    """The time.monotonic() at which the frame's last sample was captured: the sender's timestamp
    (UTC, 100 ns units: when it handed the frame, whole, to the SDK) carried onto this machine's
    clock by the arrival (`arrival` monotonic, `wall` time.time(), taken together), when it is
    within MAX_CLOCK_SKEW_S before the arrival; else (no timestamp, a sender whose clock is off
    ours) the arrival itself."""
    stamp = getattr(frame, "timestamp", TIMESTAMP_UNDEFINED)
    if stamp is None or stamp in (0, TIMESTAMP_UNDEFINED):
        return arrival
    behind = wall - stamp / TICKS
    return arrival - behind if 0.0 <= behind <= MAX_CLOCK_SKEW_S else arrival


# what an NdiReceiver hands its audio to: (samples interleaved float32, sample rate, channels, the
# monotonic capture time of the last sample, the sender's timecode of the last sample in seconds)
AudioCallback = Callable[[np.ndarray, int, int, float, float], None]


class NdiReceiver:
    """A receiver of the NDI source named by an ndi:// spec, found when made: `connect()` starts
    taking its video, `next(timeout)` gives its next frame as (RGB (H, W, 3) uint8, the sender's
    timecode in seconds, its frame rate), `disconnect()` stops (what is sent meanwhile is never
    seen, so nothing stale waits for the next `connect`). The audio that comes between video
    frames goes to `on_audio` (an `AudioCallback`) when it is set, else it is dropped."""

    def __init__(self, spec: str, find_timeout: float = FIND_TIMEOUT, connect: bool = True):
        self._ndi = _ndi()
        name, ips = parse_ndi(spec)
        self._source = find_source(name, ips, find_timeout)
        self.name = self._source.ndi_name
        self._recv = None
        self.on_audio: AudioCallback | None = None
        if connect:
            self.connect()

    @property
    def connected(self) -> bool:
        return self._recv is not None

    def connect(self) -> None:
        if self._recv is not None:
            return
        ndi = self._ndi
        settings = ndi.RecvCreateV3()
        settings.color_format = ndi.RECV_COLOR_FORMAT_RGBX_RGBA
        settings.bandwidth = ndi.RECV_BANDWIDTH_HIGHEST
        recv = ndi.recv_create_v3(settings)
        if recv is None:
            raise StreamStudioError(f"the NDI runtime could not make a receiver for {self.name!r}")
        ndi.recv_connect(recv, self._source)
        self._recv = recv

    def next(self, timeout: float) -> tuple[np.ndarray, float, float | None] | None:
        """The next video frame, None after `timeout` s without one (the audio on the way to
        `on_audio`, metadata dropped)."""
        if self._recv is None:
            raise StreamStudioError(f"the NDI receiver of {self.name!r} is not connected")
        ndi = self._ndi
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            kind, video, audio, meta = ndi.recv_capture_v2(self._recv, 200)
            if kind == ndi.FRAME_TYPE_VIDEO:
                try:
                    rgb = np.ascontiguousarray(video.data[:, :, :3])
                    t = video.timecode / TICKS  # the sender's own time of the frame (NdiSender: its pts)
                    fps = video.frame_rate_N / video.frame_rate_D if video.frame_rate_D else None
                finally:
                    ndi.recv_free_video_v2(self._recv, video)
                return rgb, t, fps
            if kind == ndi.FRAME_TYPE_AUDIO:
                arrival, wall = time.monotonic(), time.time()
                try:
                    if self.on_audio is not None:
                        samples, rate, channels = audio_samples(audio)
                        end = audio.timecode / TICKS + len(samples) / channels / rate
                        self.on_audio(samples, rate, channels, audio_captured(audio, arrival, wall), end)
                finally:
                    ndi.recv_free_audio_v2(self._recv, audio)
            elif kind == ndi.FRAME_TYPE_METADATA:
                ndi.recv_free_metadata(self._recv, meta)
        return None

    def disconnect(self) -> None:
        if self._recv is not None:
            self._ndi.recv_destroy(self._recv)
            self._recv = None

    close = disconnect


class NdiSender:
    """An NDI source called NAME (others see "HOST (NAME)"): `send(rgb, seconds)`. A frame's NDI
    timecode is its time in the stream: `seconds` (the input frame's pts, carried through), or,
    without it, one frame at `fps` after the last (a stream paced at a constant rate). The rate it
    advertises is the one those times measure over the last RATE_WINDOW frames (a live stream
    sends what its model keeps up with), `fps` until RATE_MIN_FRAMES have gone."""

    def __init__(self, spec: str, fps: float):
        self._ndi = ndi = _ndi()
        name, _ = parse_ndi(spec)
        self.fps = fps = float(fps)
        rate = frame_rate(fps)  # (checked before the runtime makes anything)
        settings = ndi.SendCreate()
        settings.ndi_name = name
        settings.clock_video = False  # frames go out as they are made (a live stream's own pace)
        self._send = ndi.send_create(settings)
        if self._send is None:
            raise StreamStudioError(f"the NDI runtime could not make a sender called {name!r}")
        self.name = name
        self._frame = ndi.VideoFrameV2()
        self._frame.FourCC = ndi.FOURCC_VIDEO_TYPE_RGBX
        self._frame.frame_rate_N, self._frame.frame_rate_D = rate
        self._times: deque[float] = deque(maxlen=RATE_WINDOW)
        self._rgbx: np.ndarray | None = None

    @property
    def rate(self) -> float:
        """The frame rate advertised now."""
        return self._frame.frame_rate_N / self._frame.frame_rate_D

    def send(self, rgb: np.ndarray, seconds: float | None = None) -> None:
        h, w = rgb.shape[:2]
        if self._rgbx is None or self._rgbx.shape[:2] != (h, w):
            self._rgbx = np.full((h, w, 4), 255, np.uint8)
        self._rgbx[:, :, :3] = rgb
        self._frame.data = self._rgbx
        t = self._time(seconds)
        self._frame.timecode = round(t * TICKS)
        self._measure(t)
        self._ndi.send_send_video_v2(self._send, self._frame)

    def _time(self, seconds: float | None) -> float:
        if seconds is not None:
            return float(seconds)
        return self._times[-1] + 1.0 / self.fps if self._times else 0.0

    def _measure(self, t: float) -> None:
        """Advertise the rate of the last frames' times: a broadcast rate as soon as they measure
        one, any other once it moved by more than RATE_CHANGE (a live rate's jitter is not news)."""
        if self._times and t <= self._times[-1]:  # a repeated or earlier time (a new run): start again
            self._times.clear()
        self._times.append(t)
        if len(self._times) < RATE_MIN_FRAMES:
            return
        measured = (len(self._times) - 1) / (self._times[-1] - self._times[0])
        rate = frame_rate(measured)
        if Fraction(*rate) in STANDARD_RATES or abs(measured - self.rate) > RATE_CHANGE * self.rate:
            self._frame.frame_rate_N, self._frame.frame_rate_D = rate

    def close(self) -> None:
        if self._send is not None:
            self._ndi.send_destroy(self._send)
            self._send = None
