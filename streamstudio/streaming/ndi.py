"""NDI in and out: the video-over-IP that live-production tools exchange (TouchDesigner, OBS with
its NDI plugin, vMix, Resolume), through `ndi-python` (an optional extra: pip install
'streamstudio[ndi]'; its wheel carries the NDI runtime, under the NDI SDK licence).

    ndi://NAME                 the source or sender called NAME; a source's full NDI name is
                               "HOST (NAME)": NAME alone finds it on any host, "HOST (NAME)" on one
    ndi://NAME?ips=A,B         also look for sources at these addresses (where multicast
                               discovery does not reach: other subnets, containers)

`NdiSource` receives a sender's video (RGBX, as the runtime converts it) and yields RGB frames
timed by the sender's timecodes (from the first frame's); `NdiSink` sends RGB frames as an NDI source (RGBX), each with
its pts as the NDI timecode (100 ns units). Discovery on this machine also asks 127.0.0.1, so a
sender and a receiver on one machine find each other without multicast.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from urllib.parse import parse_qs, urlparse

import numpy as np

from streamstudio.errors import StreamStudioError
from streamstudio.frames import fit
from streamstudio.streaming.sinks import Sink
from streamstudio.streaming.sources import MAX_SIDE, Source, SourceInfo, VideoFrame, to_rgb_frame

FIND_TIMEOUT = 10.0  # seconds a source is looked for
FIND_ROUND = 2.0  # seconds one finder looks before a new one asks the addresses again
FIRST_FRAME_TIMEOUT = 10.0  # seconds for a found source's first frame (its size)
FRAME_TIMEOUT = 5.0  # seconds without a frame before a source is said to have stopped
TICKS = 10_000_000  # NDI times are in 100 ns units


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


def find_source(name: str, ips: list[str] | None = None, timeout: float = FIND_TIMEOUT):
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


class NdiSource(Source):
    """The video of an NDI source, live: RGB frames as they come, pts from the sender's timestamps."""

    def __init__(self, spec: str, max_side: int = MAX_SIDE, find_timeout: float = FIND_TIMEOUT):
        super().__init__()
        self._ndi = ndi = _ndi()
        name, ips = parse_ndi(spec)
        self.max_side, self.spec = max_side, spec
        source = find_source(name, ips, find_timeout)
        settings = ndi.RecvCreateV3()
        settings.color_format = ndi.RECV_COLOR_FORMAT_RGBX_RGBA
        settings.bandwidth = ndi.RECV_BANDWIDTH_HIGHEST
        self._recv = ndi.recv_create_v3(settings)
        if self._recv is None:
            raise StreamStudioError(f"the NDI runtime could not make a receiver for {source.ndi_name!r}")
        ndi.recv_connect(self._recv, source)
        self.name = source.ndi_name
        first = self._next(FIRST_FRAME_TIMEOUT)
        if first is None:
            self.close()
            raise StreamStudioError(f"the NDI source {self.name!r} sent no video within {FIRST_FRAME_TIMEOUT:.0f} s")
        self._first = first
        h, w = first[0].shape[:2]
        fps = first[2] or 30.0
        self.info = SourceInfo(width=w, height=h, fps=fps, live=True, description=f"ndi://{self.name}")

    def _next(self, timeout: float) -> tuple[np.ndarray, float | None, float | None] | None:
        """(RGB frame, timestamp s or None, frame rate) of the next video frame, None after `timeout`."""
        ndi = self._ndi
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            kind, video, audio, meta = ndi.recv_capture_v2(self._recv, 200)
            if kind == ndi.FRAME_TYPE_VIDEO:
                try:
                    rgb = to_rgb_frame(np.ascontiguousarray(video.data[:, :, :3]), self.max_side)
                    t = video.timecode / TICKS  # the sender's own time of the frame (NdiSink: its pts)
                    fps = video.frame_rate_N / video.frame_rate_D if video.frame_rate_D else None
                finally:
                    ndi.recv_free_video_v2(self._recv, video)
                return rgb, t, fps
            if kind == ndi.FRAME_TYPE_AUDIO:
                ndi.recv_free_audio_v2(self._recv, audio)
            elif kind == ndi.FRAME_TYPE_METADATA:
                ndi.recv_free_metadata(self._recv, meta)
        return None

    def frames(self) -> Iterator[VideoFrame]:
        item, index, start, t0 = self._first, 0, time.monotonic(), None
        while item is not None:
            rgb, stamp, _ = item
            if stamp is not None:
                t0 = stamp if t0 is None else t0
                pts = stamp - t0
            else:
                pts = time.monotonic() - start
            yield VideoFrame(rgb, pts, index)
            index += 1
            item = self._next(FRAME_TIMEOUT)
        self.warnings.append(f"the NDI source {self.name!r} sent no frame for {FRAME_TIMEOUT:.0f} s")

    def close(self) -> None:
        if getattr(self, "_recv", None) is not None:
            self._ndi.recv_destroy(self._recv)
            self._recv = None


class NdiSink(Sink):
    """Frames out as an NDI source called NAME (others see "HOST (NAME)")."""

    def __init__(self, spec: str, width: int, height: int, fps: float):
        super().__init__(spec, width, height, fps)
        self._ndi = ndi = _ndi()
        name, _ = parse_ndi(spec)
        settings = ndi.SendCreate()
        settings.ndi_name = name
        settings.clock_video = False  # frames go out as they are made (a live stream's own pace)
        self._send = ndi.send_create(settings)
        if self._send is None:
            raise StreamStudioError(f"the NDI runtime could not make a sender called {name!r}")
        self.name = name
        self._frame = ndi.VideoFrameV2()
        self._frame.FourCC = ndi.FOURCC_VIDEO_TYPE_RGBX
        rate = float(fps)
        self._frame.frame_rate_N, self._frame.frame_rate_D = (int(round(rate * 1000)), 1000)
        self._rgbx = np.full((height, width, 4), 255, np.uint8)

    def write(self, frame: np.ndarray, pts: float | None = None) -> None:
        self._rgbx[:, :, :3] = fit(frame, self.width, self.height)
        self._frame.data = self._rgbx
        self._frame.timecode = self._ndi.SEND_TIMECODE_SYNTHESIZE if pts is None else int(round(pts * TICKS))
        self._ndi.send_send_video_v2(self._send, self._frame)
        self.status.frames_written += 1

    def close(self) -> None:
        if not self.status.closed:
            self.status.closed = True
            self._ndi.send_destroy(self._send)
