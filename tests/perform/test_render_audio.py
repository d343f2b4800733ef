"""A file's own audio drives `render --modulation` (app/perform/file_audio.py, issue 48): on a clip
whose sound is clicks at known times, off the frames' grid, an onset mapping changes its setting on
the frame at or right after each click (the issue's target: within +-1 frame of the beat) and on
no other frame; the render runs from the CLI, and an input without sound is refused."""

from __future__ import annotations

import json

import av
import numpy as np
from clips import write_audio

from streamstudio.app import cli
from streamstudio.app.perform.file_audio import FileAudio
from streamstudio.app.perform.modulation import Modulations

FPS, SECONDS, RATE = 10, 4.0, 48_000
CLICKS = (0.53, 1.27, 2.04, 2.71, 3.38)  # seconds: none on a frame's time
MAPPING = {"mappings": [{"setting": "seed", "source": {"kind": "audio", "feature": "onset"}, "low": 0, "high": 1000}]}


def click_clip(path, clicks=CLICKS, sound: bool = True):
    """64x64 frames at FPS and, with `sound`, PCM audio: silence with a 2 ms click at each time."""
    container = av.open(str(path), "w")
    v = container.add_stream("mpeg4", rate=FPS)
    v.width, v.height, v.pix_fmt = 64, 64, "yuv420p"
    if sound:
        a = container.add_stream("pcm_s16le", rate=RATE)
        a.layout = "mono"
        x = np.zeros(int(RATE * SECONDS), np.float32)
        for t in clicks:
            x[int(t * RATE): int(t * RATE) + 96] = 0.9
        write_audio(container, a, x, RATE)
    for i in range(int(FPS * SECONDS)):
        img = np.full((64, 64, 3), (i * 6) % 256, np.uint8)
        for packet in v.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
            container.mux(packet)
    for packet in v.encode(None):
        container.mux(packet)
    container.close()
    return path


def test_each_click_moves_the_setting_on_its_frame_and_nothing_else_does(tmp_path):
    audio = FileAudio(str(click_clip(tmp_path / "clicks.mkv")), 1.0 / FPS)
    mods = Modulations.parse(MAPPING)
    try:
        times = [k / FPS for k in range(int(FPS * SECONDS))]
        hit = [t for t in times if mods.values(t, None, audio).get("seed") == 1000]
    finally:
        audio.close()
    frame = 1.0 / FPS
    for click in CLICKS:  # the frame at or right after the click shows it (+-1 frame of the beat)
        near = [t for t in hit if -frame <= t - click <= frame + 1e-9]
        assert near, (click, hit)
    assert all(min(abs(t - c) for c in CLICKS) <= frame + 1e-9 for t in hit), hit  # no frame away from a click
    assert len(hit) <= 2 * len(CLICKS), hit


def test_render_takes_its_inputs_sound_and_refuses_a_silent_input(tmp_path, capsys):
    mods = tmp_path / "mods.json"
    mods.write_text(json.dumps(MAPPING))
    args = ["--model", "tiny", "--device", "cpu", "--threads", "1", "--steps", "1", "--mode", "offline",
            "--modulation", str(mods)]
    out = tmp_path / "out.mkv"
    assert cli.main(["render", "--input", str(click_clip(tmp_path / "in.mkv")), "--output", str(out), *args]) == 0
    with av.open(str(out)) as c:
        assert sum(1 for _ in c.decode(video=0)) == int(FPS * SECONDS)
    silent = click_clip(tmp_path / "silent.mkv", sound=False)
    assert cli.main(["render", "--input", str(silent), "--output", str(tmp_path / "o2.mkv"), *args]) == 1
    assert "has no audio track" in capsys.readouterr().err


def test_without_the_hold_a_frame_misses_most_clicks(tmp_path):
    """(Why the hold: a frame reads the newest 10 ms analysis frame, so most hits fall between frames.)"""
    audio = FileAudio(str(click_clip(tmp_path / "clicks.mkv")), 1.0 / FPS)
    audio.features.onset_hold_s = 0.0
    try:
        seen = sum(audio.audio("onset", k / FPS) == 1.0 for k in range(int(FPS * SECONDS)))
    finally:
        audio.close()
    assert seen < len(CLICKS)
