"""The splat settings table (pipelines/live_settings.SPLAT_SETTINGS): the Splats tab's view
controls and `streamstudio splat`'s camera and render flags are made from it, so each range and
default is written once, and the renderer's config starts from the same defaults."""

from __future__ import annotations

import argparse

import pytest

from streamstudio.app.cli import splat
from streamstudio.app.web.splat_tab import ViewSettings, click_orbit, view_control
from streamstudio.errors import StreamStudioError
from streamstudio.pipelines.live_settings import SPLAT_SETTINGS


def splat_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    splat.add_parser(parser.add_subparsers(dest="command"))
    return parser


def dest(setting) -> str:
    return setting.flag.lstrip("-").replace("-", "_")


def test_the_command_line_the_tab_and_the_render_config_start_from_the_table():
    import gradio as gr

    from streamstudio.pipelines.splats.splat_render import SplatRenderConfig

    args, view, config = splat_parser().parse_args(["splat", "sample"]), ViewSettings(), SplatRenderConfig()
    for s in SPLAT_SETTINGS.values():
        if s.flag is not None:
            assert getattr(args, dest(s)) == (None if s.cli_optional else s.default), s.name
        if s.pipeline:
            assert getattr(config, s.name) == s.default, s.name
        if hasattr(view, s.name):
            assert getattr(view, s.name) == s.default, s.name
        if s.widget is not None:
            with gr.Blocks():
                control = view_control(s.name, view)
            assert control.value == s.default and control.label == s.label, s.name
            if s.widget == "slider":  # the slider's range is the table's (or its narrower slider range)
                low = s.low if s.slider_low is None else s.slider_low
                high = s.high if s.slider_high is None else s.slider_high
                assert (control.minimum, control.maximum, control.step) == (low, high, s.step), s.name
            else:
                assert [value for _, value in control.choices] == list(s.choices), s.name
    assert SPLAT_SETTINGS["elevation"].flag and SPLAT_SETTINGS["sh_degree"].flag  # the ranges once written twice


def test_every_render_setting_with_a_flag_reaches_the_render_config():
    """Each table setting of the renderer's config given a value other than its default on the
    command line is in the config `splat` renders with (a setting added to the table needs no
    other line)."""
    from streamstudio.pipelines.splats.splat_render import SplatRenderConfig

    def other(s):
        if s.kind is bool:
            return [s.flag] if not s.default else [f"--no-{s.flag[2:]}"]
        if s.choices:
            return [s.flag, next(c for c in reversed(s.choices) if c != s.default)]
        value = s.low + 1 if s.kind is int else (s.low + min(s.high, 100.0)) / 2
        return [s.flag, str(value if value != s.default else s.low + 2)]

    chosen = [s for s in SPLAT_SETTINGS.values() if s.pipeline and s.flag is not None]
    assert {s.name for s in chosen} >= {"sh_degree", "mode", "camera", "fov_y_deg", "impl", "antialiased"}
    argv = ["splat", "sample", *[word for s in chosen for word in other(s)]]
    args = splat_parser().parse_args(argv)
    given = splat.render_settings(args)
    config = SplatRenderConfig(**given)
    for s in chosen:
        assert getattr(config, s.name) == getattr(args, dest(s)) != s.default, s.name
    assert splat.render_settings(splat_parser().parse_args(["splat", "sample"])) == {
        s.name: s.default for s in chosen if not s.cli_optional}


def test_one_range_for_the_flags_the_tab_and_the_size(capsys):
    elevation = SPLAT_SETTINGS["elevation"]
    with pytest.raises(SystemExit):
        splat_parser().parse_args(["splat", "sample", "--elevation", str(elevation.high + 1)])
    assert f"elevation must be in [{elevation.low:g}, {elevation.high:g}]" in capsys.readouterr().err
    view = click_orbit(ViewSettings(elevation=elevation.high, width=48, height=32), 24, 32)  # a click at the bottom
    assert view.elevation == elevation.high
    with pytest.raises(SystemExit):
        splat_parser().parse_args(["splat", "sample", "--sh-degree", "4"])
    side = SPLAT_SETTINGS["width"]
    assert splat.parse_size(f"{side.low}x{side.high}") == (side.low, side.high)
    with pytest.raises(StreamStudioError, match=f"use {side.low}..{side.high} pixels"):
        splat.parse_size(f"{side.high + 8}x64")


def test_splat_takes_the_image_flags_as_the_image_pipeline_declares_them():
    """--prompt, --model, --steps, --strength, --seed and --device are the image pipeline's own
    options (app/settings.add_pipeline_arguments), not a second declaration."""
    from streamstudio.app.settings import add_pipeline_arguments

    image = argparse.ArgumentParser()
    add_pipeline_arguments(image)
    sub = next(a for a in splat_parser()._actions if isinstance(a, argparse._SubParsersAction))
    ours = sub.choices["splat"]._option_string_actions
    for flag in (*splat.STYLISE_FLAGS, "--device"):
        theirs = image._option_string_actions[flag]
        same = ("default", "help", "choices", "nargs", "metavar", "dest")
        assert [getattr(ours[flag], k) for k in same] == [getattr(theirs, k) for k in same], flag
        assert getattr(ours[flag].type, "__name__", None) == getattr(theirs.type, "__name__", None), flag
    with pytest.raises(SystemExit):  # --steps keeps the pipeline's range (the LCM schedule's 50)
        splat_parser().parse_args(["splat", "sample", "--steps", "51"])
