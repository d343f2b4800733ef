"""Errors a user can cause give one `error: ...` line and exit code 1, never a traceback (issue 11):
bad files (PLY headers, .splat sizes, prompt schedules, .safetensors models), config values of the
wrong type, outputs that cannot be written and out-of-range pipeline settings. Inputs that are
damaged but usable render with a warning: a video whose audio codec is unknown (rendered without
its audio) and a video whose frame timestamps are broken (given new ones at its nominal rate)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
from clips import frame_image, make_clip, probe

from streamstudio.app.cli import main
from streamstudio.models.image.loading import BUILTIN_DIR

av = pytest.importorskip("av", reason="PyAV is not installed (the GPU image has none)")

TINY = ["--model", "tiny", "--device", "cpu"]
GOOD_PLY_HEADER = ["ply", "format binary_little_endian 1.0", "element vertex 1",
                   *(f"property float {name}" for name in ("x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2", "opacity",
                                                            "scale_0", "scale_1", "scale_2",
                                                            "rot_0", "rot_1", "rot_2", "rot_3")),
                   "end_header"]


# ---------------------------------------------------------------------------- bad inputs
def ply(tmp: Path, **change: str) -> str:
    """A one-Gaussian 3DGS .ply whose header lines are changed: {old line: new line}."""
    lines = [change.get(line, line) for line in GOOD_PLY_HEADER]
    path = tmp / "bad.ply"
    path.write_bytes(("\n".join(lines) + "\n").encode() + bytes(4 * 14))
    return str(path)


def splat_cmd(scene: str, output: str = "out.mp4") -> list[str]:
    return ["splat", scene, "--frames", "1", "--size", "32x32", "--output", output]


def render_cmd(tmp: Path, *extra: str, output: str | None = None) -> list[str]:
    return ["render", "--input", "pattern:32x32", "--output", output or str(tmp / "out.mp4"), "--max-frames", "1",
            *TINY, *extra]


def config(tmp: Path, text: str) -> str:
    path = tmp / "render.yaml"
    path.write_text(text)
    return str(path)


def garbage_model(tmp: Path) -> str:
    path = tmp / "model.safetensors"
    path.write_bytes(b"\xff" * 8 + b"not a safetensors header" * 40)
    return str(path)


def binary_schedule(tmp: Path) -> str:
    path = tmp / "prompts.txt"
    path.write_bytes(bytes(range(256)) * 4)
    return str(path)


def a_file(tmp: Path) -> Path:
    path = tmp / "somefile.txt"
    path.write_text("not a folder\n")
    return path


def generate_cmd(tmp: Path, *extra: str, output: str | None = None) -> list[str]:
    return ["generate", "--model", "tiny", "--device", "cpu", "--output", output or str(tmp / "gen"),
            "--prompt", "x", *extra]


CASES = {
    # .ply headers and .splat sizes
    "ply count abc": lambda t: splat_cmd(ply(t, **{"element vertex 1": "element vertex abc"}), str(t / "o.mp4")),
    "ply count -5": lambda t: splat_cmd(ply(t, **{"element vertex 1": "element vertex -5"}), str(t / "o.mp4")),
    "ply duplicate property": lambda t: splat_cmd(ply(t, **{"property float y": "property float x"}),
                                                  str(t / "o.mp4")),
    "ply unnamed element": lambda t: splat_cmd(ply(t, **{"element vertex 1": "element"}), str(t / "o.mp4")),
    "ply element without count": lambda t: splat_cmd(ply(t, **{"element vertex 1": "element vertex"}),
                                                     str(t / "o.mp4")),
    "ply unnamed property": lambda t: splat_cmd(ply(t, **{"property float y": "property float"}), str(t / "o.mp4")),
    "splat size not 32n": lambda t: (t.joinpath("bad.splat").write_bytes(bytes(33)),
                                     splat_cmd(str(t / "bad.splat"), str(t / "o.mp4")))[1],
    # a binary prompt schedule
    "binary prompt schedule": lambda t: render_cmd(t, "--prompt-schedule", binary_schedule(t)),
    # --config values of the wrong type
    "config strength string": lambda t: render_cmd(t, "--config", config(t, "strength: strong\n")),
    "config width string": lambda t: render_cmd(t, "--config", config(t, "width: wide\n")),
    "config fps string": lambda t: render_cmd(t, "--config", config(t, "fps: fast\n")),
    "config max-frames string": lambda t: ["render", "--input", "pattern:32x32", "--output", str(t / "o.mp4"),
                                           *TINY, "--config", config(t, "max-frames: ten\n")],
    "config seed string": lambda t: render_cmd(t, "--config", config(t, "seed: lucky\n")),
    # outputs that cannot be written
    "render output under a file": lambda t: render_cmd(t, output=str(a_file(t) / "out.mp4")),
    "render output under /proc": lambda t: render_cmd(t, output="/proc/streamstudio-test/out.mp4"),
    "render frames under a file": lambda t: render_cmd(t, output=str(a_file(t) / "frames")),
    "splat output under a file": lambda t: splat_cmd("sample", str(a_file(t) / "out.mp4")),
    "splat output under /proc": lambda t: splat_cmd("sample", "/proc/out.mp4"),
    "generate output under a file": lambda t: generate_cmd(t, output=str(a_file(t) / "images")),
    "generate output under /proc": lambda t: generate_cmd(t, output="/proc/streamstudio-test"),
    "serve output-dir a file": lambda t: ["serve", "--model", "tiny", "--output-dir", str(a_file(t))],
    "train-video output a file": lambda t: ["train-video", "--steps", "1", "--output", str(a_file(t))],
    "train-image output a file": lambda t: ["train-image", "--steps", "1", "--output", str(a_file(t))],
    "train-image latent-channels without init": lambda t: ["train-image", "--latent-channels", "16", "--output",
                                                          str(t / "ti")],
    "train-image latent-channels not a multiple": lambda t: ["train-image", "--init", str(BUILTIN_DIR),
                                                             "--latent-channels", "13", "--output", str(t / "ti")],
    "build-engines engine-dir a file": lambda t: ["build-engines", "--model", "tiny", "--engine-dir", str(a_file(t))],
    # a device torch does not know (its own message lists twenty device types)
    "render device bogus": lambda t: render_cmd(t, "--device", "bogus"),
    # a garbage .safetensors model
    "render garbage safetensors": lambda t: render_cmd(t, "--model", garbage_model(t)),
    "generate garbage safetensors": lambda t: generate_cmd(t, "--model", garbage_model(t)),
}

# Out-of-range settings are usage errors, said while the command line is parsed (exit code 2,
# argparse's `prog: error: argument --flag: ...` line after the command's usage), before anything loads.
USAGE_CASES = {
    "generate width 0": lambda t: generate_cmd(t, "--width", "0"),
    "generate height 0": lambda t: generate_cmd(t, "--height", "0"),
    "generate steps 0": lambda t: generate_cmd(t, "--steps", "0"),
    "generate guidance -5": lambda t: generate_cmd(t, "--guidance", "-5"),
    "generate filter-threshold 2": lambda t: generate_cmd(t, "--filter-threshold", "2"),
    "generate threads 0": lambda t: generate_cmd(t, "--threads", "0"),
    # the training and engine commands' numbers (a traceback, a hang or a wrong success before)
    "train-video size 0": lambda t: ["train-video", "--size", "0", "--output", str(t / "tv")],
    "train-video batch-size 0": lambda t: ["train-video", "--batch-size", "0", "--output", str(t / "tv")],
    "train-video lr nan": lambda t: ["train-video", "--lr", "nan", "--output", str(t / "tv")],
    "train-video steps -1": lambda t: ["train-video", "--steps", "-1", "--output", str(t / "tv")],
    "train-image vae-batch-size 0": lambda t: ["train-image", "--vae-batch-size", "0", "--output", str(t / "ti")],
    "train-image steps -1": lambda t: ["train-image", "--steps", "-1", "--output", str(t / "ti")],
    "build-engines width 0": lambda t: ["build-engines", "--model", "tiny", "--width", "0"],
    # 0 is a value, not "unset" (it once ran silently at the default strength)
    "render video strength 0": lambda t: ["render", "--pipeline", "video", "--input", "pattern:32x32",
                                          "--video-strength", "0", "--max-frames", "4", "--output", str(t / "v.mp4")],
}


@pytest.mark.parametrize("case", list(USAGE_CASES))
def test_out_of_range_setting_is_a_usage_error(case, tmp_path, capsys):
    argv = USAGE_CASES[case](tmp_path)
    rc = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert rc == 2, f"{case}: exit code {rc}\n{err[-2000:]}"
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and "argument --" in error_lines[0], err[-2000:]


@pytest.mark.parametrize("case", list(CASES))
def test_user_error_is_one_line_without_traceback(case, tmp_path, capsys):
    argv = CASES[case](tmp_path)
    rc = main(argv)
    out, err = capsys.readouterr()
    error_lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert "Traceback" not in out + err
    assert rc == 1, f"{case}: exit code {rc}\n{err[-2000:]}"
    assert len(error_lines) == 1, err[-2000:]
    assert len(error_lines[0]) > len("error: ") + 10


def test_config_strings_convert_as_the_command_line_would(tmp_path):
    import argparse

    from streamstudio.app.cli import render

    parser = argparse.ArgumentParser()
    render.add_parser(parser.add_subparsers())
    args = parser.parse_args(["render"])
    path = config(tmp_path, "strength: '0.5'\nwidth: '64'\nseed: 7.0\nfps: 12\nno-audio: true\nt-index: [10, '20']\n")
    render.apply_config(args, path)
    assert (args.strength, args.width, args.seed, args.fps, args.no_audio, args.t_index) == (0.5, 64, 7, 12.0,
                                                                                             True, [10, 20])
    assert isinstance(args.fps, float) and isinstance(args.seed, int)


# ---------------------------------------------------------------------------- damaged but usable inputs
def test_unknown_audio_codec_renders_the_video_without_audio(tmp_path, capsys):
    clip = make_clip(tmp_path / "in.mkv", n=6, fps=6, w=32, h=32, audio=True)
    data = clip.read_bytes()
    assert data.count(b"A_AAC") == 1
    bad = tmp_path / "unknown_audio.mkv"
    bad.write_bytes(data.replace(b"A_AAC", b"A_ZZZ"))  # a Matroska codec id no ffmpeg knows
    out = tmp_path / "out.mp4"
    rc = main(["render", "--input", str(bad), "--output", str(out), *TINY])
    err = capsys.readouterr().err
    assert rc == 0 and "Traceback" not in err
    assert "audio stream 0 has a codec" in err
    got = probe(out)
    assert got.frames == 6 and got.audio_codec is None


def write_broken_timestamps(path: Path, pts: list[int], time_base: Fraction, rate: int = 14) -> Path:
    """A clip whose frames carry the given timestamps (all equal, or one tick apart)."""
    container = av.open(str(path), "w")
    v = container.add_stream("libx264", rate=rate)
    v.width, v.height, v.pix_fmt = 32, 32, "yuv420p"
    v.codec_context.time_base = v.time_base = time_base
    for i, t in enumerate(pts):
        frame = av.VideoFrame.from_ndarray(frame_image(i, 32, 32), format="rgb24")
        frame.pts, frame.time_base = t, time_base
        for packet in v.encode(frame):
            container.mux(packet)
    for packet in v.encode(None):
        container.mux(packet)
    container.close()
    return path


@pytest.mark.parametrize("name, pts", [("equal.mkv", [0] * 14), ("squeezed.mp4", list(range(14)))])
def test_broken_timestamps_are_regenerated_at_the_nominal_rate(tmp_path, capsys, name, pts):
    """14 frames with equal timestamps, or 1/90000 s apart: the output has 14 frames, strictly
    increasing timestamps one nominal frame time apart (14 fps for the mkv, whose header says so;
    the mp4's own average rate for the mp4), and one warning says so."""
    clip = write_broken_timestamps(tmp_path / name, pts, Fraction(1, 90000))
    with av.open(str(clip)) as c:
        nominal = float(c.streams.video[0].average_rate)
    if name.endswith(".mkv"):
        assert nominal == 14
    out = tmp_path / "out.mp4"
    rc = main(["render", "--input", str(clip), "--output", str(out), *TINY])
    err = capsys.readouterr().err
    assert rc == 0 and "Traceback" not in err
    assert err.count("warning: ") == 1 and "broken frame timestamps" in err
    got = probe(out)
    assert got.frames == 14
    assert got.video_pts == pytest.approx([k / nominal for k in range(14)], abs=2e-4)
