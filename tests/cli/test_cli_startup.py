"""The CLI answers at once (issue 25): `--help` and argument errors import no heavy library, and
every check that needs no model (ranges, nan/inf, sizes, output kind, input exists, output is not
the input, port range and port free) is said before a model loads. Each runs in a fresh
interpreter, where what a command imported is what `sys.modules` holds afterwards;
benchmarks/cli_startup.py times the same commands."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from streamstudio.app.cli import COMMANDS

HEAVY = ("torch", "diffusers", "transformers", "gradio", "av", "cv2", "fastrtc", "aiortc", "ray", "huggingface_hub")


def run_cli(argv: list[str], cwd: Path | None = None, env: dict | None = None) -> dict:
    """`streamstudio argv` in a new interpreter: its exit code, stdout, stderr and the heavy
    modules it imported."""
    code = textwrap.dedent(f"""
        import contextlib, io, json, sys
        from streamstudio.app.cli import main
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main({argv!r})
        print(json.dumps({{"rc": rc, "out": out.getvalue(), "err": err.getvalue(),
                          "heavy": [m for m in {HEAVY!r} if m in sys.modules]}}))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env=None if env is None else {**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_imports_nothing_heavy(command):
    """`streamstudio --help` and every `streamstudio COMMAND --help` (on main before issue 25,
    render, splat and the training commands imported torch, train-image diffusers too)."""
    result = run_cli(["--help"] if command is None else [command, "--help"])
    assert result["rc"] == 0
    assert "usage: streamstudio" in result["out"]
    assert result["heavy"] == [], f"{command} --help imported {result['heavy']}"


def test_top_level_help_lists_every_command():
    out = run_cli(["--help"])["out"]
    for name in COMMANDS:
        assert name in out


ARGUMENT_ERRORS = {
    "strength 2": (["generate", "--output", "o", "--strength", "2"], "--strength", "(0, 1]"),
    "strength nan": (["generate", "--output", "o", "--strength", "nan"], "--strength", "nan"),
    "guidance inf": (["generate", "--output", "o", "--guidance", "inf"], "--guidance", "inf"),
    "seed -1": (["generate", "--output", "o", "--seed", "-1"], "--seed", "-1"),
    "width 100": (["generate", "--output", "o", "--width", "100"], "--width", "multiple of 8"),
    "height 0": (["generate", "--output", "o", "--height", "0"], "--height", "0"),
    "steps 0": (["generate", "--output", "o", "--steps", "0"], "--steps", "0"),
    "num-images 0": (["generate", "--output", "o", "--num-images", "0"], "--num-images", "0"),
    "render fps 0": (["render", "--input", "pattern", "--output", "o.mp4", "--fps", "0"], "--fps", "0"),
    "render max-frames -3": (["render", "--input", "pattern", "--output", "o.mp4", "--max-frames", "-3"],
                             "--max-frames", "-3"),
    "render video-strength 0": (["render", "--pipeline", "video", "--output", "o.mp4", "--video-strength", "0"],
                                "--video-strength", "0"),
    "serve port 99999": (["serve", "--port", "99999"], "--port", "99999"),
    "serve port 0": (["serve", "--port", "0"], "--port", "0"),
    "serve osc-port 70000": (["serve", "--osc-port", "70000"], "--osc-port", "70000"),
    "splat fov 200": (["splat", "sample", "--output", "o.mp4", "--fov", "200"], "--fov", "200"),
    "splat sh-degree 4": (["splat", "sample", "--output", "o.mp4", "--sh-degree", "4"], "--sh-degree", "4"),
    "splat path typo": (["splat", "sample", "--output", "o.mp4", "--path", "orbitt"], "--path", "orbitt"),
}


@pytest.mark.parametrize("case", list(ARGUMENT_ERRORS))
def test_argument_errors_are_usage_errors_before_anything_loads(case, tmp_path):
    """A value out of range (nan and inf too) is the command's usage error, exit code 2, one
    `error:` line naming the option, no traceback and no heavy import (on main, `generate
    --strength 2` answered after the model loaded)."""
    argv, flag, shown = ARGUMENT_ERRORS[case]
    result = run_cli(argv, cwd=tmp_path)
    err = result["err"]
    assert result["rc"] == 2, err
    assert f"usage: streamstudio {argv[0]}" in err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and flag in errors[0] and shown in errors[0], err
    assert "Traceback" not in err
    assert result["heavy"] == [], f"{case} imported {result['heavy']}"


def test_misspelt_option_is_the_commands_error_with_the_nearest_option(tmp_path):
    """`generate --promt red` was the top-level parser's error (its usage, no hint)."""
    result = run_cli(["generate", "--output", "o", "--promt", "red"], cwd=tmp_path)
    assert result["rc"] == 2
    assert "usage: streamstudio generate" in result["err"]
    assert "unrecognized arguments: --promt red (did you mean --prompt?)" in result["err"]
    assert result["heavy"] == []


def one_error(result: dict) -> str:
    lines = [line for line in result["err"].splitlines() if line.startswith("error:")]
    assert result["rc"] == 1 and len(lines) == 1 and "Traceback" not in result["err"], result["err"]
    return lines[0]


def test_render_checks_input_and_output_before_the_model(tmp_path):
    """A missing input, an output render cannot write (.avi) and an output that is the input:
    one line each, before torch is imported (on main: after the model loaded, 57 s)."""
    line = one_error(run_cli(["render", "--input", str(tmp_path / "none.mp4"), "--output", "o.mp4"], cwd=tmp_path))
    assert "does not exist" in line
    result = run_cli(["render", "--input", "pattern:32x32", "--output", "x.avi"], cwd=tmp_path)
    assert ".avi" in one_error(result) and result["heavy"] == []
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(b"not really a video, but the user's file")
    result = run_cli(["render", "--input", str(clip), "--output", str(clip)], cwd=tmp_path)
    assert "destroy the input" in one_error(result) and result["heavy"] == []
    assert clip.read_bytes() == b"not really a video, but the user's file"
    result = run_cli(["render", "--pipeline", "video", "--output", "x.avi"], cwd=tmp_path)
    assert ".avi" in one_error(result) and result["heavy"] == []


def test_generate_refuses_to_write_over_its_input(tmp_path):
    from PIL import Image

    photo = tmp_path / "photo.png"
    Image.new("RGB", (40, 30), (200, 10, 10)).save(photo)
    before = photo.read_bytes()
    result = run_cli(["generate", "--input", str(photo), "--output", str(tmp_path), "--model", "tiny"], cwd=tmp_path)
    assert "destroy the input" in one_error(result) and result["heavy"] == []
    assert photo.read_bytes() == before


def test_serve_says_a_port_in_use_before_the_model(tmp_path):
    """A port in use was `[Errno 98]` and exit 3 after the model loaded, with no hint."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_cli(["serve", "--port", str(port), "--model", "tiny"], cwd=tmp_path)
    line = one_error(result)
    assert f"port {port}" in line and "in use" in line and "--port" in line
    assert result["heavy"] == []


def test_splat_names_match_the_renderer():
    """The splat settings table (which the splat command parses with) writes the renderer's names
    so that parsing imports no torch; they must stay the renderer's."""
    from streamstudio.kernels.splat import IMPLS
    from streamstudio.pipelines import live_settings as table
    from streamstudio.pipelines.splats.splat_render import CAMERAS, MODES, PATHS

    assert (table.SPLAT_PATHS, table.SPLAT_MODES, table.SPLAT_IMPLS) == (PATHS, MODES, IMPLS)
    assert table.SPLAT_CAMERAS == tuple(CAMERAS)


def test_training_config_defaults_match_the_data():
    from streamstudio.app.training.config import ImageTrainConfig
    from streamstudio.models.image import image_data

    assert ImageTrainConfig().style_share == image_data.DEFAULT_STYLE_SHARE


def test_help_says_the_defaults_the_commands_use():
    """`generate --help` gave --width default 512 where the model it runs on a CPU makes 256, and
    serve's and splat's help said "sd-turbo if cached" where a CPU always runs the built-in model."""
    from streamstudio.models.image.loading import load_builtin

    helps = {c: run_cli([c, "--help"])["out"] for c in ("generate", "serve", "splat", "render")}
    assert all("if cached" not in text for text in helps.values())
    width_help = " ".join(helps["generate"].split("\n  --width WIDTH", 1)[1].split("\n  --height", 1)[0].split())
    assert f"{load_builtin().default_size} for builtin" in width_help
    assert "default 512," not in width_help


@pytest.mark.parametrize("hub", ["HF_HUB_OFFLINE=1", "refused"])
def test_a_hub_model_that_cannot_be_had_is_said_before_torch_loads(hub, tmp_path):
    """`generate --model sd-turbo` offline printed a minute of retry warnings and suggested
    `hf download sd-turbo` (no such repository); now one line names stabilityai/sd-turbo and the
    command, before torch or diffusers is imported."""
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    if hub == "refused":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": f"http://127.0.0.1:{port}"}
    for argv in (["generate", "--model", "sd-turbo", "--output", "o"],
                 ["render", "--input", "pattern", "--output", "o.mp4", "--model", "sd-turbo"]):
        result = run_cli(argv, cwd=tmp_path, env=env)
        line = one_error(result)
        assert "stabilityai/sd-turbo" in line and "`hf download stabilityai/sd-turbo`" in line
        assert result["heavy"] in ([], ["huggingface_hub"]), result["heavy"]
