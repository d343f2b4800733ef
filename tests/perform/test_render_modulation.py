"""`render --modulation FILE --bpm` (issue 48's CLI): the file's mappings at each frame's media time,
so an offline render's modulation is the same run after run; refused where it cannot apply."""

from __future__ import annotations

import json

import pytest

from streamstudio.app import cli
from streamstudio.app.perform.modulation import apply_at, load_modulations
from streamstudio.app.perform.tempo import TempoClock
from streamstudio.errors import StreamStudioError


class Recorder:
    def __init__(self):
        self.updates: list[dict] = []

    def update(self, **changes):
        self.updates.append(changes)


def test_the_mappings_follow_media_time_and_the_files_tempo(tmp_path):
    path = tmp_path / "mods.json"
    path.write_text(json.dumps({"mappings": [
        {"setting": "guidance_scale", "source": {"kind": "lfo", "shape": "saw", "beats": 2}, "low": 1.0, "high": 3.0},
        {"setting": "delta", "source": {"kind": "midi", "cc": 1}}]}))  # no knob in a render: left alone
    mods, pipe = load_modulations(str(path)), Recorder()
    clock = TempoClock(60.0, origin=0.0)  # a beat a second: the saw takes 2 s a cycle
    for t in (0.0, 0.5, 1.0, 1.5):
        apply_at(pipe, mods, clock, t)
    assert [u["guidance_scale"] for u in pipe.updates] == pytest.approx([1.0, 1.5, 2.0, 2.5])
    assert all("delta" not in u for u in pipe.updates)


def render_args(tmp_path, *extra):
    return ["render", "--input", "pattern:32x32", "--output", str(tmp_path / "out.mp4"), "--max-frames", "3",
            "--model", "tiny", "--device", "cpu", "--threads", "1", "--mode", "offline", *extra]


def test_render_takes_a_modulation_file(tmp_path, capsys):
    path = tmp_path / "mods.json"
    path.write_text(json.dumps({"mappings": [
        {"setting": "guidance_scale", "source": {"kind": "lfo", "rate": 2.0}, "low": 1.0, "high": 2.0},
        {"setting": "seed", "source": {"kind": "beat"}, "low": 0, "high": 50}]}))
    assert cli.main(render_args(tmp_path, "--modulation", str(path), "--bpm", "100")) == 0
    assert (tmp_path / "out.mp4").stat().st_size > 0
    # strength re-makes a Stream Batch buffer (the tiny model runs 2 steps): refused before a frame
    path.write_text(json.dumps({"mappings": [{"setting": "strength", "source": {"kind": "lfo"},
                                              "low": 0.4, "high": 0.8}]}))
    assert cli.main(render_args(tmp_path, "--modulation", str(path))) != 0
    assert "re-makes the Stream Batch buffer" in capsys.readouterr().err
    assert cli.main(render_args(tmp_path, "--modulation", str(path), "--steps", "1")) == 0


@pytest.mark.parametrize("extra, words", [
    (["--modulation", "MISSING"], "is not a readable JSON file"),
    (["--modulation", "BAD"], "cannot be modulated"),
    (["--modulation", "GOOD", "--pipeline", "video"], "not with --pipeline video"),
])
def test_render_refuses_a_modulation_it_cannot_apply(tmp_path, capsys, extra, words):
    (tmp_path / "BAD").write_text(json.dumps({"mappings": [{"setting": "prompt"}]}))
    (tmp_path / "GOOD").write_text(json.dumps({"mappings": []}))
    extra = [str(tmp_path / e) if e in ("MISSING", "BAD", "GOOD") else e for e in extra]
    rc = cli.main(render_args(tmp_path, *extra))
    assert rc != 0 and words in capsys.readouterr().err


def test_a_batch_render_refuses_modulation(tmp_path):
    from streamstudio.app.cli import build_parser, render

    (tmp_path / "GOOD").write_text(json.dumps({"mappings": []}))
    args = build_parser().parse_args(["render", "--input", "pattern:32x32", "--output", str(tmp_path / "o.mp4"),
                                      "--model", "tiny", "--workers", "2", "--modulation", str(tmp_path / "GOOD")])
    with pytest.raises(StreamStudioError, match="one file in one run"):
        render.check(args)
