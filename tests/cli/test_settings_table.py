"""One settings table (pipelines/live_settings.py): a setting declared there reaches the web API's
check, the Live tab, the command line and the render config file, and all of them apply the
same range."""

from __future__ import annotations

import argparse

import pytest

from streamstudio.app import settings as app_settings
from streamstudio.errors import StreamStudioError
from streamstudio.pipelines import live_settings
from streamstudio.pipelines.live_settings import SETTINGS, LiveSetting
from streamstudio.pipelines.image.stream_diffusion import StreamDiffusionConfig

DUMMY = LiveSetting("dummy_knob", float, 0.25, "a knob only this test has", flag="--dummy-knob", low=0.0, high=2.0,
                    widget="slider", step=0.25, label="Dummy knob", pipeline=False)


@pytest.fixture
def with_dummy(monkeypatch):
    monkeypatch.setattr(live_settings, "SETTINGS", {**SETTINGS, DUMMY.name: DUMMY})
    return DUMMY


def render_parser() -> argparse.ArgumentParser:
    from streamstudio.app.cli import render

    parser = argparse.ArgumentParser()
    render.add_parser(parser.add_subparsers(dest="command"))
    return parser


def test_a_new_setting_reaches_the_api(with_dummy):
    assert app_settings.parse_settings({"dummy_knob": 1}) == {"dummy_knob": 1.0}
    with pytest.raises(StreamStudioError, match=r"^dummy_knob must be in \[0, 2\], got 3 \(option --dummy-knob\)$"):
        app_settings.parse_settings({"dummy_knob": 3})
    with pytest.raises(StreamStudioError, match="wrong type"):
        app_settings.parse_settings({"dummy_knob": "loud"})


def test_a_new_setting_reaches_the_live_tab(with_dummy):
    import gradio as gr

    with gr.Blocks():
        controls = app_settings.live_controls(StreamDiffusionConfig(width=64, height=48))
    knob = controls["dummy_knob"]
    assert isinstance(knob, gr.Slider) and (knob.minimum, knob.maximum, knob.value) == (0.0, 2.0, 0.25)
    assert knob.label == "Dummy knob"
    assert app_settings.live_keys()[-1] == "dummy_knob"
    values = [None] * (len(controls) - 1) + [0.5]
    assert app_settings.settings_from_ui(tuple(controls), values) == {"dummy_knob": 0.5}


def test_a_new_setting_reaches_the_command_line_and_the_config_file(with_dummy, tmp_path):
    from streamstudio.app.cli import render

    parser = render_parser()
    assert parser.parse_args(["render"]).dummy_knob == 0.25
    assert parser.parse_args(["render", "--dummy-knob", "1.5"]).dummy_knob == 1.5
    args = parser.parse_args(["render"])
    config = tmp_path / "render.yaml"
    config.write_text("dummy-knob: '0.75'\n")
    render.apply_config(args, config)
    assert args.dummy_knob == 0.75


VIDEO_DUMMY = LiveSetting("dummy_blur", float, 0.5, "a video knob only this test has", flag="--dummy-blur", low=0.0,
                          high=1.0, widget="slider", step=0.1, label="Dummy blur", pipeline=False)


@pytest.fixture
def with_video_dummy(monkeypatch):
    monkeypatch.setattr(live_settings, "VIDEO_SETTINGS",
                        {**live_settings.VIDEO_SETTINGS, VIDEO_DUMMY.name: VIDEO_DUMMY})
    return VIDEO_DUMMY


def test_a_new_video_setting_reaches_the_command_line_the_config_file_and_the_video_tab(with_video_dummy, tmp_path):
    import gradio as gr

    from streamstudio.app.cli import render

    parser = render_parser()
    assert parser.parse_args(["render"]).dummy_blur == 0.5
    assert parser.parse_args(["render", "--dummy-blur", "0.25"]).dummy_blur == 0.25
    args = parser.parse_args(["render"])
    config = tmp_path / "render.yaml"
    config.write_text("dummy-blur: '0.75'\n")
    render.apply_config(args, config)
    assert args.dummy_blur == 0.75
    with gr.Blocks():
        controls = app_settings.video_controls()
    assert list(controls) == ["strength", "solver", "dummy_blur"]
    knob = controls["dummy_blur"]
    assert isinstance(knob, gr.Slider) and (knob.minimum, knob.maximum, knob.value, knob.label) == (0.0, 1.0, 0.5,
                                                                                                  "Dummy blur")
    assert app_settings.video_values(tuple(controls), [0.6, "heun", 0.3]) == {"strength": 0.6, "solver": "heun",
                                                                              "dummy_blur": 0.3}
    with pytest.raises(StreamStudioError, match=r"^dummy_blur must be in \[0, 1\], got 2 \(option --dummy-blur\)$"):
        app_settings.video_values(tuple(controls), [0.6, "euler", 2])


def test_one_range_for_the_video_flags_the_video_tab_and_the_buffer(capsys):
    """--video-strength, the Video tab's Strength slider and StreamBufferConfig take (0, 1] from
    one declaration (the slider ran 0.1..1 on its own before)."""
    import gradio as gr

    from streamstudio.pipelines.video.stream_video import StreamBufferConfig

    with gr.Blocks():
        strength = app_settings.video_controls()["strength"]
    assert strength.minimum > 0 and strength.maximum == 1.0
    StreamBufferConfig(strength=strength.minimum).validate()
    with pytest.raises(StreamStudioError, match=r"^strength must be in \(0, 1\], got 0"):
        StreamBufferConfig(strength=0.0).validate()
    with pytest.raises(SystemExit):
        render_parser().parse_args(["render", "--video-strength", "0"])
    assert "strength must be in (0, 1], got 0" in capsys.readouterr().err
    with pytest.raises(StreamStudioError, match=r"^num_chunks must be in \[1, 64\], got 0"):
        StreamBufferConfig(num_chunks=0).validate()
    buffer = StreamBufferConfig()  # the checkpoint-free defaults are the table's (strength: 1 there, text-to-video)
    for name in ("num_chunks", "chunk_size", "micro_steps", "solver"):
        assert getattr(buffer, name) == live_settings.VIDEO_SETTINGS[name].default, name


def test_one_scale_range_for_the_api_the_command_line_and_the_model_and_a_slider_that_shows_the_start():
    """The add-on scales were checked by hand in three places at [-10, 10]; the table's ADDON_SCALE
    is now the one range, and the sliders show 0..2 widened to the start value."""
    import gradio as gr

    from streamstudio.app.settings import CONTROL_SCALES, IP_ADAPTER_SCALE
    from streamstudio.models.image import lora

    low, high = live_settings.ADDON_SCALE.low, live_settings.ADDON_SCALE.high
    assert (low, high) == (-10.0, 10.0)
    for edge in (low, high):
        assert app_settings.parse_settings({IP_ADAPTER_SCALE: edge, CONTROL_SCALES: [edge, 0.5]}) == {
            IP_ADAPTER_SCALE: edge, CONTROL_SCALES: [edge, 0.5]}
        assert lora.check_scale(edge) == edge and lora.split_scale(f"a/b:{edge:g}", "--controlnet") == ("a/b", edge)
    for beyond in (low - 0.5, high + 0.5):
        with pytest.raises(StreamStudioError, match=r"in \[-10, 10\]"):
            app_settings.parse_settings({IP_ADAPTER_SCALE: beyond})
        with pytest.raises(StreamStudioError, match=r"in \[-10, 10\]"):
            app_settings.parse_settings({CONTROL_SCALES: [0.5, beyond]})
        with pytest.raises(StreamStudioError, match=r"in \[-10, 10\]"):
            lora.check_scale(beyond)
    with gr.Blocks():
        usual = app_settings.widget(live_settings.ADDON_SCALE, 0.8, label="scale")
        strong = app_settings.widget(live_settings.ADDON_SCALE, 3.0, label="scale")
        negative = app_settings.widget(live_settings.ADDON_SCALE, -0.5, label="scale")
    assert (usual.minimum, usual.maximum, usual.value) == (0.0, 2.0, 0.8)
    assert (strong.minimum, strong.maximum) == (0.0, 3.0) and (negative.minimum, negative.maximum) == (-0.5, 2.0)


def test_one_range_for_the_api_the_ui_and_the_pipeline():
    """Guidance once took 30 through the API and at most 5 on the Live tab's slider."""
    import gradio as gr

    with gr.Blocks():
        controls = app_settings.live_controls(StreamDiffusionConfig(width=64, height=64))
    guidance = controls["guidance_scale"]
    assert app_settings.parse_settings({"guidance_scale": guidance.maximum}) == {"guidance_scale": guidance.maximum}
    StreamDiffusionConfig(guidance_scale=guidance.maximum).validate()
    too_high = guidance.maximum + 0.5
    with pytest.raises(StreamStudioError, match="guidance_scale must be in"):
        app_settings.parse_settings({"guidance_scale": too_high})
    with pytest.raises(StreamStudioError, match="guidance_scale must be in"):
        StreamDiffusionConfig(guidance_scale=too_high).validate()
    strength = controls["strength"]
    assert strength.minimum > 0  # strength 0 is refused everywhere: the slider starts one step above


def test_the_command_line_the_live_tab_and_the_config_start_from_the_table():
    """One default per setting: the flag's (when the command does not pick it), the Live tab
    control's and StreamDiffusionConfig's field's are the table's."""
    import gradio as gr

    parser = argparse.ArgumentParser()
    app_settings.add_pipeline_arguments(parser)
    app_settings.add_setting_flags(parser, names=["fit"])  # (render and generate add it with their inputs)
    args, config = parser.parse_args([]), StreamDiffusionConfig()
    with gr.Blocks():
        controls = app_settings.live_controls(config)
    for s in SETTINGS.values():
        if s.flag is not None:
            flag = getattr(args, s.flag.lstrip("-").replace("-", "_"))
            assert flag == (None if s.cli_optional else s.default), s.name
        if s.widget is not None:
            assert controls[s.name].value == s.default, s.name
        if s.pipeline:
            assert getattr(config, s.name) == s.default, s.name


def test_cfg_types_are_the_kernels_codes():
    from streamstudio.kernels.reference import CFG_CODES

    assert live_settings.CFG_TYPES == tuple(CFG_CODES)


@pytest.mark.parametrize("raw, words", [
    ({"seed": 2.5}, "seed"), ({"bank_size": 99}, r"^bank_size must be in \[0, 16\], got 99 \(option --bank-size\)$"),
    ({"temporal": "blur"}, r"^temporal must be one of off, feedback, bank, both, got 'blur' \(option --temporal\)$"),
    ({"max_skip_frame": 3}, "unknown setting"),  # set at start only, not on a running stream
    ({"prompt": "x" * 1001}, "at most 1000 characters"),
    ({"prompt": [["x" * 1001, 1.0]]}, "at most 1000 characters"),
])
def test_api_errors_are_one_line_naming_the_setting(raw, words):
    with pytest.raises(StreamStudioError, match=words) as err:
        app_settings.parse_settings(raw)
    assert "\n" not in str(err.value)


def test_osc_takes_its_types_from_the_table():
    from streamstudio.app.web.osc import settings_from_message

    assert settings_from_message("/streamstudio/s1/seed", (7.0,)) == ("s1", {"seed": 7})
    assert settings_from_message("/streamstudio/s1/filter", (1,)) == ("s1", {"similarity_filter": True})
    with pytest.raises(StreamStudioError, match="takes a number"):
        settings_from_message("/streamstudio/s1/strength", (True,))


@pytest.mark.parametrize("bad", [
    dict(kind=list), dict(widget="knob"), dict(widget="slider", step=None),
    dict(choices=("a", "b"), choice_labels=("A",)),
])
def test_a_slip_in_a_declaration_fails_at_once(bad):
    with pytest.raises(TypeError, match="setting x"):
        LiveSetting(**{**dict(name="x", kind=float, default=0.0, help="x", low=0.0, high=1.0, step=0.1), **bad})


def test_the_fallback_webcam_gets_every_control_and_the_request(monkeypatch):
    """The plain-webcam fallback takes the Live tab's controls as *values, so Gradio must still
    hand it the request (it does so only to a positional parameter before *values)."""
    import gradio as gr
    from gradio.helpers import special_args

    from streamstudio.app.web import ui

    class Model:
        config = StreamDiffusionConfig(width=64, height=64)
        prompt, negative_prompt = "a cat", ""

    class Manager:
        model, max_streams = Model(), 2

    got = []
    monkeypatch.setattr(ui, "fallback_step", lambda manager, sid, frame, values, keys: got.append(
        (sid, frame, dict(zip(keys, values)))) or (None, "ok"))
    with gr.Blocks() as demo:
        controls = app_settings.live_controls(Model.config, Model.prompt)
        ui._fallback(Manager(), controls)
    step = next(block.fn for block in demo.fns.values() if getattr(block.fn, "__name__", "") == "step")
    values = [c.value for c in controls.values()]
    request = gr.Request(username="u")
    request.session_hash = "abc"
    inputs, _, _ = special_args(step, ["frame", *values], request)
    step(*inputs)
    assert got == [("fallback-abc", "frame", dict(zip(controls, values)))]
    assert got[0][2]["prompt"] == "a cat" and got[0][2]["fit"] == "crop"


def test_a_config_file_may_name_live_settings_as_the_api_does(tmp_path):
    from streamstudio.app.cli import render

    config = tmp_path / "render.yaml"
    config.write_text("guidance_scale: 2.5\ncfg_type: full\nsimilarity_threshold: 0.9\nguidance-scale-typo: 1\n")
    args = render_parser().parse_args(["render"])
    with pytest.raises(StreamStudioError, match="unknown setting.*guidance-scale-typo"):
        render.apply_config(args, config)
    config.write_text("guidance_scale: 2.5\ncfg_type: full\nsimilarity_threshold: 0.9\n")
    render.apply_config(args, config)
    assert (args.guidance, args.cfg, args.filter_threshold) == (2.5, "full", 0.9)


def test_every_pipeline_setting_reaches_the_config_from_the_command_line():
    """The stream's config takes every table setting of the pipeline that has a flag from the
    command line (settings.config_values: build_pipeline once copied 14 of them by hand). Each is
    given a value other than its default, and found in the config of the stream that opens."""
    from streamstudio.app.cli import build_parser
    from streamstudio.app.cli.requests import image_request
    from streamstudio.app.streams import build_pipeline

    def other_value(s):
        if s.choices:
            return next(c for c in reversed(s.choices) if c != s.default)
        if s.kind is int:
            return s.low + 1 if s.low + 1 != s.default else s.low + 2
        return round(s.low + (s.high - s.low) * 0.3, 4)

    chosen = {s.name: other_value(s) for s in SETTINGS.values() if s.pipeline and s.flag is not None}
    assert len(chosen) >= 13
    flags = [word for s in SETTINGS.values() if s.name in chosen for word in (s.flag, str(chosen[s.name]))]
    argv = ["generate", "--model", "tiny", "--output", "unused", *flags]
    config = build_pipeline(image_request(build_parser(argv).parse_args(argv)), "img2img").config
    assert {name: getattr(config, name) for name in chosen} == chosen
    assert config.similarity_filter  # the threshold given turns the filter on


def test_the_video_tabs_step_is_the_video_solver_flags_choices(capsys):
    """The Video tab's Step radio offers --video-solver's choices (the page sends the name, shows
    the label), starts at the value it is given (the tab gives the checkpoint's) and the page's
    value is checked as the flag's is."""
    import gradio as gr

    from streamstudio.pipelines.live_settings import VIDEO_SOLVERS

    with gr.Blocks():
        step = app_settings.video_controls(["solver"], {"solver": "heun"})["solver"]
        default = app_settings.video_controls(["solver"])["solver"]
    assert isinstance(step, gr.Radio) and step.value == "heun" and default.value == "euler"
    assert [value for _, value in step.choices] == list(VIDEO_SOLVERS) == ["euler", "ab2", "heun"]
    assert app_settings.video_values(["solver"], ["ab2"]) == {"solver": "ab2"}
    with pytest.raises(StreamStudioError, match=r"^solver must be one of euler, ab2, heun, got 'rk4'"):
        app_settings.video_values(["solver"], ["rk4"])
    with pytest.raises(SystemExit):
        render_parser().parse_args(["render", "--video-solver", "rk4"])
    assert "--video-solver: solver must be one of euler, ab2, heun, got 'rk4'" in capsys.readouterr().err
