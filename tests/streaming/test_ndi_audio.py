"""An NDI source's audio into the audio features a modulation reads (streaming/ndi.py, issue 48),
at the library's boundary (`ndi_fake.FakeNdi`: NDI discovers by multicast). A sender written from
ndi-python's API sends 30 fps video and 48 kHz stereo audio (planar float32, its planes a padded
stride apart, as NDI lays them out) with 2 ms clicks at known times; each click becomes an onset
stamped within a frame after the time it was captured, and nothing else does: read by itself,
through `serve --input ndi://`'s stream, and by `render --input ndi:// --modulation`."""

from __future__ import annotations

import threading
import time
import types

import numpy as np
import pytest

from ndi_fake import install_fake_ndi

from streamstudio.app.perform.audio_features import AudioFeatures
from streamstudio.streaming.ndi import TICKS, TIMESTAMP_UNDEFINED, audio_captured, audio_samples

pytestmark = pytest.mark.timeout(120)
FRAME_S = 1 / 30


class AvCamera:
    """An NDI sender of video (a flat grey, 30 fps) and audio (48 kHz, 2 channels, 1024 samples a
    frame, each handed over when its last sample is due, as a capture card does), silent but for a
    2 ms click at each time.monotonic() in `clicks` (appended to while it runs). Each plane is
    followed by PAD samples of 0.9: a receiver that ignores the channel stride hears clicks
    everywhere."""

    RATE, N, CHANNELS, PAD = 48_000, 1024, 2, 32
    START = 3 * 3600 * TICKS

    def __init__(self, ndi, name: str, clicks: list[float]):
        self.ndi, self.clicks = ndi, clicks
        self.sender = ndi.send_create(ndi.SendCreate(ndi_name=name, clock_video=False))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.t0 = time.monotonic()
        self.thread.start()

    def _audio(self, k: int):
        stride = self.N + self.PAD
        planes = np.full((self.CHANNELS, stride), 0.9, np.float32)
        planes[:, :self.N] = 0.0
        start = self.t0 + k * self.N / self.RATE
        for c in list(self.clicks):
            i = int(round((c - start) * self.RATE))
            if -96 < i < self.N:
                planes[:, max(0, i):max(0, min(self.N, i + 96))] = 0.8
        return self.ndi.AudioFrameV2(data=planes.reshape(-1), sample_rate=self.RATE, no_channels=self.CHANNELS,
                                     no_samples=self.N, channel_stride_in_bytes=4 * stride,
                                     timecode=self.START + round(k * self.N * TICKS / self.RATE))

    def _run(self) -> None:
        video = self.ndi.VideoFrameV2(FourCC=self.ndi.FOURCC_VIDEO_TYPE_RGBX, frame_rate_N=30, frame_rate_D=1)
        i = k = 0
        while not self.stop.is_set():
            next_video, next_audio = self.t0 + i * FRAME_S, self.t0 + (k + 1) * self.N / self.RATE
            if self.stop.wait(max(0.0, min(next_video, next_audio) - time.monotonic())):
                return
            if next_audio <= next_video:
                self.ndi.send_send_audio_v2(self.sender, self._audio(k))
                k += 1
            else:
                video.data, video.timecode = np.full((48, 64, 4), 60, np.uint8), self.START + round(i * FRAME_S * TICKS)
                self.ndi.send_send_video_v2(self.sender, video)
                i += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.ndi.send_destroy(self.sender)


def first_onsets(read, clicks: list[float], latency: float) -> list[float | None]:
    """For each click, how long after click + latency the onset is first read (2 ms steps)."""
    out = []
    for c in clicks:
        ts = [c + latency - 0.05 + 0.002 * j for j in range(100)]
        out.append(next((round(t - c - latency, 4) for t in ts if read(t) == 1.0), None))
    return out


def test_an_ndi_sources_clicks_are_onsets_within_a_frame_of_their_capture(monkeypatch):
    from streamstudio.streaming.sources import open_source

    fake = install_fake_ndi(monkeypatch)
    clicks: list[float] = []
    camera = AvCamera(fake, "avcam", clicks)
    features = AudioFeatures(AvCamera.RATE)
    taken: list[tuple[int, int, float, float]] = []

    def on_audio(samples, rate, channels, captured, timecode):
        taken.append((rate, channels, captured, timecode))
        features.push(samples, captured, channels)

    try:
        with open_source("ndi://avcam") as source:
            source.on_audio = on_audio
            for frame in source.frames():
                if not clicks:
                    now = time.monotonic()
                    clicks.extend(now + 0.4 + 0.37 * j for j in range(5))  # off the video's and the audio's grids
                if time.monotonic() > clicks[-1] + 0.3:
                    break
    finally:
        camera.close()
    assert taken and {(r, c) for r, c, _, _ in taken} == {(48_000, 2)}
    steps = np.diff([tc for *_, tc in taken])  # the sender's timecodes: one audio frame apart
    assert np.allclose(steps, AvCamera.N / AvCamera.RATE, atol=1e-6)
    landed = first_onsets(lambda t: features.at("onset", t, 0.0), clicks, 0.0)
    assert all(e is not None and -0.002 <= e <= FRAME_S for e in landed), landed
    span = [clicks[0] - 0.3 + 0.002 * j for j in range(round((clicks[-1] - clicks[0] + 0.5) / 0.002))]
    onsets = [features.at("onset", t, 0.0) for t in span]
    rises = sum(1 for a, b in zip(onsets, onsets[1:]) if b == 1.0 != a)
    assert rises == len(clicks), rises  # an onset at each click, none elsewhere (the stride's padding is not audio)


def test_an_audio_frames_capture_time_is_the_senders_timestamp_on_our_clock():
    arrival, wall = 1000.0, 1_700_000_000.0
    frame = types.SimpleNamespace(timestamp=round((wall - 0.07) * TICKS))
    assert audio_captured(frame, arrival, wall) == pytest.approx(arrival - 0.07, abs=1e-6)  # 70 ms on the way
    for stamp in (TIMESTAMP_UNDEFINED, 0, round((wall - 5.0) * TICKS), round((wall + 0.2) * TICKS)):
        assert audio_captured(types.SimpleNamespace(timestamp=stamp), arrival, wall) == arrival  # none, another clock


def test_audio_samples_reads_planes_by_their_stride():
    planes = np.arange(2 * 6, dtype=np.float32).reshape(2, 6)  # 2 channels, 4 samples, a stride of 6
    for data in (planes, planes.reshape(-1)):  # as ndi-python hands it (rows), or the raw buffer
        frame = types.SimpleNamespace(data=data, no_channels=2, no_samples=4, channel_stride_in_bytes=24,
                                      sample_rate=44_100)
        samples, rate, channels = audio_samples(frame)
        assert (rate, channels) == (44_100, 2) and samples.tolist() == [0, 6, 1, 7, 2, 8, 3, 9]


def test_serve_reads_an_ndi_inputs_audio_into_its_streams_modulation(monkeypatch):
    """`serve --input ndi://avcam --input-stream stage` with `seed <- onset`: the clicks reach the
    stream's audio features within a frame of click + the stream's latency offset, and its seed."""
    from live_server import start

    from streamstudio.app.web.perform_routes import set_modulations

    fake = install_fake_ndi(monkeypatch)
    clicks: list[float] = []
    camera = AvCamera(fake, "avcam", clicks)
    server = start("--input", "ndi://avcam", "--input-stream", "stage")
    try:
        manager = server.manager
        deadline = time.monotonic() + 60
        while (session := manager.get("stage")) is None or session.processed < 3:
            assert time.monotonic() < deadline, "the NDI input never reached the model"
            time.sleep(0.05)
        set_modulations(manager, manager.inputs, "stage", {"mappings": [
            {"setting": "seed", "source": {"kind": "audio", "feature": "onset"}, "low": 0, "high": 1000}]})
        now = time.monotonic()
        clicks.extend(now + 0.5 + 0.41 * j for j in range(5))
        seeds = set()
        while time.monotonic() < clicks[-1] + 1.0:
            seeds.add(session.stats()["settings"].get("seed"))
            time.sleep(0.01)
        view = manager.inputs.view("stage")
        latency = view.latency_s()
        landed = first_onsets(lambda t: view.audio("onset", t), clicks, latency)
    finally:
        server.close()
        camera.close()
    assert all(e is not None and -0.002 <= e <= FRAME_S for e in landed), (landed, latency)
    assert {0, 1000} <= seeds, seeds  # silence at the bottom of the range, each click at the top


def test_render_reads_an_ndi_inputs_audio_on_its_frames_clock(monkeypatch, tmp_path):
    """`render --input ndi://avcam --modulation` with `seed <- onset`: the NDI source's own sound
    is the audio source (it was refused: "a live input's sound reaches the server as a WHIP
    stream"), on the frames' clock: a click at sender time T is an onset at pts T - the first
    frame's time, within a frame after."""
    import json

    from streamstudio.app.cli import main, render_run
    from streamstudio.app.perform.file_audio import NdiAudio

    fake = install_fake_ndi(monkeypatch)
    clicks: list[float] = []
    camera = AvCamera(fake, "avcam", clicks)
    clicks.extend(camera.t0 + 0.25 * j for j in range(1, 400))  # every 250 ms for 100 s
    seen: list[tuple[float, object, NdiAudio]] = []
    apply_at = render_run.apply_at

    def record(pipe, mods, clock, t, inputs=None):
        values = apply_at(pipe, mods, clock, t, inputs)
        seen.append((t, values.get("seed"), inputs))
        return values

    monkeypatch.setattr(render_run, "apply_at", record)
    mods = tmp_path / "mods.json"
    mods.write_text(json.dumps({"mappings": [
        {"setting": "seed", "source": {"kind": "audio", "feature": "onset"}, "low": 0, "high": 1000}]}))
    try:
        assert main(["render", "--model", "tiny", "--input", "ndi://avcam", "--modulation", str(mods),
                     "--max-frames", "45", "--width", "64", "--height", "48", "--steps", "1",
                     "--output", "ndi://out"]) == 0
    finally:
        camera.close()
    ndi_audio = seen[-1][2]
    assert isinstance(ndi_audio, NdiAudio) and {v for _, v, _ in seen} >= {0, 1000}, [v for _, v, _ in seen]
    origin = ndi_audio.source.origin  # the first frame's sender time: pts 0
    assert origin is not None
    on_pts = [(c - camera.t0) + AvCamera.START / TICKS - origin for c in clicks]  # each click's pts
    span = [t for t in on_pts if 0.1 < t < seen[-1][0] - 0.1]
    assert len(span) >= 3
    landed = first_onsets(lambda t: ndi_audio.audio("onset", t), span, 0.0)
    assert all(e is not None and -0.002 <= e <= FRAME_S for e in landed), landed
