"""ndi-python's `NDIlib` faked, for the tests of NDI in and out (tests/streaming/test_ndi.py, the
Live outputs' NDI choice): NDI discovers by multicast, so the real runtime runs only in a network
namespace of its own; everywhere else the tests meet NDI at its library's boundary."""

from __future__ import annotations

import sys
import threading
import time
import types
from collections import defaultdict, deque



class FakeNdi(types.ModuleType):
    """ndi-python's `NDIlib` without a network: a sender made by send_create is a source finders
    list as "FAKEHOST (NAME)"; a receiver connected to it gets a copy of each frame sent while it
    is connected (the newest QUEUE wait, as in the runtime), with the sender's timecode (the send
    time for SEND_TIMECODE_SYNTHESIZE) and frame rate. `sent[NAME]` records what the sender set
    on each frame; a sender's audio (send_send_audio_v2: planar float32, each plane
    channel_stride_in_bytes apart) reaches its receivers as the runtime hands it (a 2-D array, one
    row a channel, whose rows may run past no_samples), stamped with the send time (`timestamp`,
    UTC in 100 ns, as the SDK stamps a frame handed to it), before any video queued; `connections` each
    receiver's (connected, disconnected) monotonic times; `made` the receivers, each with the
    timecodes of the frames it `took`."""

    FRAME_TYPE_NONE, FRAME_TYPE_VIDEO, FRAME_TYPE_AUDIO, FRAME_TYPE_METADATA = range(4)
    RECV_COLOR_FORMAT_RGBX_RGBA, RECV_BANDWIDTH_HIGHEST, FOURCC_VIDEO_TYPE_RGBX = "RGBX_RGBA", "highest", "RGBX"
    SEND_TIMECODE_SYNTHESIZE = 2**63 - 1
    QUEUE = 4
    FindCreate = RecvCreateV3 = SendCreate = VideoFrameV2 = AudioFrameV2 = Source = types.SimpleNamespace
    AUDIO_QUEUE = 64

    def __init__(self):
        super().__init__("NDIlib")
        self.cond = threading.Condition()
        self.senders: set[str] = set()
        self.receivers: list = []
        self.sent: dict[str, list] = defaultdict(list)
        self.made: list = []
        self.connections: list[list[float]] = []

    def initialize(self) -> bool:
        return True

    # finding
    def find_create_v2(self, settings):
        return object()

    def find_wait_for_sources(self, finder, ms: int) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.senders, ms / 1000)

    def find_get_current_sources(self, finder) -> list:
        with self.cond:
            return [self.Source(ndi_name=f"FAKEHOST ({n})", url_address="127.0.0.1:5961") for n in self.senders]

    def find_destroy(self, finder) -> None:
        pass

    # receiving
    def recv_create_v3(self, settings):
        assert settings.color_format == self.RECV_COLOR_FORMAT_RGBX_RGBA
        recv = types.SimpleNamespace(name=None, queue=deque(maxlen=self.QUEUE), audio=deque(maxlen=self.AUDIO_QUEUE),
                                     times=None, took=[])
        self.made.append(recv)
        return recv

    def recv_connect(self, recv, source) -> None:
        with self.cond:
            recv.name = source.ndi_name.partition(" (")[2][:-1]
            recv.times = [time.monotonic(), float("inf")]
            self.connections.append(recv.times)
            self.receivers.append(recv)

    def recv_capture_v2(self, recv, ms: int):
        with self.cond:
            if not self.cond.wait_for(lambda: recv.queue or recv.audio, ms / 1000):
                return self.FRAME_TYPE_NONE, None, None, None
            if recv.audio:
                return self.FRAME_TYPE_AUDIO, None, recv.audio.popleft(), None
            video = recv.queue.popleft()
            recv.took.append(video.timecode)
            return self.FRAME_TYPE_VIDEO, video, None, None

    def recv_free_video_v2(self, recv, video) -> None:
        video.data = None

    def recv_free_audio_v2(self, recv, audio) -> None:
        audio.data = None

    def recv_destroy(self, recv) -> None:
        with self.cond:
            if recv in self.receivers:
                self.receivers.remove(recv)
                recv.times[1] = time.monotonic()

    # sending
    def send_create(self, settings):
        with self.cond:
            assert settings.ndi_name not in self.senders, "two senders of one name"
            self.senders.add(settings.ndi_name)
            self.cond.notify_all()
        return types.SimpleNamespace(name=settings.ndi_name)

    def send_send_video_v2(self, send, frame) -> None:
        assert frame.FourCC == self.FOURCC_VIDEO_TYPE_RGBX and frame.data.shape[2] == 4
        n, d = frame.frame_rate_N, frame.frame_rate_D
        with self.cond:
            self.sent[send.name].append(types.SimpleNamespace(timecode=frame.timecode, rate=(n, d),
                                                              image=frame.data[:, :, :3].copy()))
            timecode = time.time_ns() // 100 if frame.timecode == self.SEND_TIMECODE_SYNTHESIZE else frame.timecode
            for recv in self.receivers:
                if recv.name == send.name:
                    recv.queue.append(types.SimpleNamespace(data=frame.data.copy(), timecode=timecode,
                                                            frame_rate_N=n, frame_rate_D=d))
            self.cond.notify_all()

    def send_send_audio_v2(self, send, frame) -> None:
        planes = frame.data.reshape(frame.no_channels, frame.channel_stride_in_bytes // 4)
        assert frame.data.dtype.name == "float32" and planes.shape[1] >= frame.no_samples
        with self.cond:
            for recv in self.receivers:
                if recv.name == send.name:
                    recv.audio.append(types.SimpleNamespace(
                        data=planes.copy(), sample_rate=frame.sample_rate, no_channels=frame.no_channels,
                        no_samples=frame.no_samples, channel_stride_in_bytes=frame.channel_stride_in_bytes,
                        timecode=frame.timecode, timestamp=time.time_ns() // 100))
            self.cond.notify_all()

    def send_destroy(self, send) -> None:
        with self.cond:
            self.senders.discard(send.name)


def install_fake_ndi(monkeypatch) -> FakeNdi:
    """A FakeNdi in place of `NDIlib` for one test."""
    fake = FakeNdi()
    monkeypatch.setitem(sys.modules, "NDIlib", fake)
    return fake
