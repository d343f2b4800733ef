"""Prompt schedules: parsing (text, YAML, JSON), blending over the transition, errors; ControlNet and
IP-Adapter scales at times, applied by the render command."""

from __future__ import annotations

import numpy as np
import pytest

from streamstudio.errors import StreamStudioError
from streamstudio.streaming.schedule import (
    PromptKey,
    PromptSchedule,
    ScaleKey,
    load_schedule,
    parse_text,
    parse_time,
)


def test_parse_time_formats():
    assert parse_time("12.5") == 12.5
    assert parse_time("1:02.5") == 62.5
    assert parse_time("1:00:02") == 3602
    assert parse_time(3) == 3.0
    for bad in ("abc", "-1", "1:xx"):
        with pytest.raises(StreamStudioError):
            parse_time(bad)


def test_text_schedule_blends_over_the_transition(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("# a schedule\n0 a red city\n0:02 a blue forest  # comment\ntransition 1\n5 a green sea\n")
    s = load_schedule(path)
    assert s.transition == 1.0 and [k.at for k in s.keys] == [0, 2, 5]
    assert s.at(0.0) == "a red city"
    assert s.at(1.99) == "a red city"
    assert s.at(2.0) == "a red city"  # weight 0 of the new prompt
    assert s.at(2.5) == [("a red city", 0.5), ("a blue forest", 0.5)]
    assert s.at(2.75) == [("a red city", 0.25), ("a blue forest", 0.75)]
    assert s.at(3.0) == "a blue forest"
    assert s.at(100) == "a green sea"


def test_weights_always_sum_to_one_and_rise():
    s = PromptSchedule([PromptKey(0, "a"), PromptKey(1, "b")], transition=2.0)
    previous = 0.0
    for i in range(1, 40):
        spec = s.at(1 + i * 0.05)
        if isinstance(spec, str):
            assert spec == "b" and i * 0.05 >= 2 * (1 - 0.025) - 1e-9  # rounded to the 0.05 weight step
            continue
        (pa, wa), (pb, wb) = spec
        assert (pa, pb) == ("a", "b") and wa + wb == pytest.approx(1.0) and wb >= previous
        previous = wb


def test_yaml_and_json_schedules(tmp_path):
    (tmp_path / "s.yaml").write_text("transition: 0.5\nprompts:\n  - {at: 0, prompt: one}\n"
                                     "  - {at: '0:01', prompt: two}\n")
    s = load_schedule(tmp_path / "s.yaml")
    assert s.transition == 0.5 and s.at(1.25) == [("one", 0.5), ("two", 0.5)]
    (tmp_path / "s.json").write_text('[{"at": 0, "prompt": "x"}, {"at": 2, "prompt": "y"}]')
    s = load_schedule(tmp_path / "s.json", transition=0)
    assert s.at(1.99) == "x" and s.at(2.0) == "y"


def test_apply_only_calls_set_prompt_on_changes():
    calls = []
    s = parse_text("0 a\n1 b\ntransition 0.5")
    for i in range(40):
        s.apply(calls.append, i * 0.05)  # 2 s at 20 fps
    assert calls[0] == "a" and calls[-1] == "b"
    assert len(calls) == len(set(map(repr, calls))) == 2 + 9  # a, 9 blend steps (0.1 .. 0.9), b


@pytest.mark.parametrize("text, message", [
    ("", "at least one prompt"),
    ("0 a\n0 b", "same time"),
    ("zero a cat", "line 1"),
    ("5", "expected 'TIME PROMPT'"),
    ("transition x\n0 a", "expected a number"),
])
def test_bad_schedules(text, message):
    with pytest.raises(StreamStudioError, match=message):
        parse_text(text)


def test_bad_schedule_files(tmp_path):
    with pytest.raises(StreamStudioError, match="does not exist"):
        load_schedule(tmp_path / "nope.txt")
    (tmp_path / "bad.yaml").write_text("prompts: [at: 1\n")
    with pytest.raises(StreamStudioError, match="not valid YAML"):
        load_schedule(tmp_path / "bad.yaml")
    (tmp_path / "bad2.yaml").write_text("prompts:\n  - {when: 1, prompt: x}\n")
    with pytest.raises(StreamStudioError, match="expected"):
        load_schedule(tmp_path / "bad2.yaml")


# ---------------------------------------------------------------------- scales
def test_scale_entries_in_text_and_yaml(tmp_path):
    (tmp_path / "s.txt").write_text("0 a fox\n0 control_scales = 1.0 0.5\n2 control_scales = 0, 0.5  # comma too\n"
                                    "3 ip_adapter_scale = 0.4\ntransition 1\n")
    s = load_schedule(tmp_path / "s.txt")
    assert [k.prompt for k in s.keys] == ["a fox"]
    assert s.scales == [ScaleKey(0, "control_scales", (1.0, 0.5)), ScaleKey(2, "control_scales", (0.0, 0.5)),
                        ScaleKey(3, "ip_adapter_scale", 0.4)]
    assert s.settings_at(0) == {"control_scales": [1.0, 0.5], "ip_adapter_scale": 0.4}  # first entry from the start
    assert s.settings_at(2.0)["control_scales"] == [1.0, 0.5]  # the new entry at weight 0
    assert s.settings_at(2.5)["control_scales"] == [0.5, 0.5]  # moved linearly over the transition
    assert s.settings_at(2.75)["control_scales"] == [0.25, 0.5]
    assert s.settings_at(9)["control_scales"] == [0.0, 0.5]
    (tmp_path / "s.yaml").write_text("transition: 0\nprompts:\n  - {at: 0, prompt: one, control_scales: [0.9]}\n"
                                     "  - {at: '0:01', control_scales: [0.1], ip_adapter_scale: 1}\n")
    s = load_schedule(tmp_path / "s.yaml")
    assert [k.prompt for k in s.keys] == ["one"] and s.at(5) == "one"
    assert s.settings_at(0.99) == {"control_scales": [0.9], "ip_adapter_scale": 1.0}
    assert s.settings_at(1.0) == {"control_scales": [0.1], "ip_adapter_scale": 1.0}
    only_scales = parse_text("0 ip_adapter_scale = 0.2")  # no prompt: the pipeline's own stays
    assert only_scales.at(3) is None and only_scales.settings_at(3) == {"ip_adapter_scale": 0.2}


def test_apply_calls_update_only_on_changes():
    prompts, updates = [], []
    s = parse_text("0 a\n0 control_scales = 1 1\n1 control_scales = 0 1\ntransition 0.5")
    for i in range(40):
        s.apply(prompts.append, i * 0.05, lambda **kw: updates.append(kw))
    assert prompts == ["a"]
    assert updates[0] == {"control_scales": [1.0, 1.0]} and updates[-1] == {"control_scales": [0.0, 1.0]}
    assert len(updates) == 1 + 10  # the first value, 9 steps of the ramp (0.9 .. 0.1), the last
    assert parse_text("0 a").apply(prompts.append, 0.0, lambda **kw: updates.append(kw)) and len(updates) == 11


@pytest.mark.parametrize("text, message", [
    ("0 control_scales = ", "expected 'TIME PROMPT'|control_scales takes"),
    ("0 control_scales = 1 x", "expected a number"),
    ("0 control_scales = 11", "in \\[-10, 10\\]"),
    ("0 ip_adapter_scale = 1 2", "takes one number"),
    ("0 control_scales = 1\n2 control_scales = 1 1", "same number of scales"),
    ("0 ip_adapter_scale = 1\n0 ip_adapter_scale = 0", "same time"),
])
def test_bad_scale_entries(text, message):
    with pytest.raises(StreamStudioError, match=message):
        parse_text(text)


def test_bad_yaml_scale_entries(tmp_path):
    (tmp_path / "a.yaml").write_text("prompts:\n  - {at: 0, control_scale: [1]}\n")
    with pytest.raises(StreamStudioError, match="expected|unknown key"):
        load_schedule(tmp_path / "a.yaml")
    (tmp_path / "b.yaml").write_text("prompts:\n  - {at: 0, prompt: x, ip_adapter_scale: [1, 2]}\n")
    with pytest.raises(StreamStudioError, match="entry 1: ip_adapter_scale takes one number"):
        load_schedule(tmp_path / "b.yaml")


@pytest.fixture(scope="module")
def controlnet_folder(tmp_path_factory):
    from addon_models import tiny_controlnet

    from streamstudio.models.image.loading import load_components

    folder = tmp_path_factory.mktemp("cn") / "net"
    tiny_controlnet(load_components("tiny").unet, 0).save_pretrained(folder)
    return folder


def test_render_applies_a_scheduled_control_scale_at_its_frame(tmp_path, controlnet_folder, monkeypatch, capsys):
    """`render --prompt-schedule` with a ControlNet: the schedule drops the conditioning scale from
    1.5 to 0 at 0.5 s; at 10 fps the pipeline runs frames 0-4 at 1.5 and frames 5-7 at 0 (the scale
    the UNet's ControlNet call gets, recorded per input frame), and the outputs change with it."""
    from PIL import Image

    from streamstudio.app.cli import main
    from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion

    rng = np.random.default_rng(3)
    src = tmp_path / "in"
    src.mkdir()
    for i in range(8):
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(src / f"{i:02d}.png")
    seen = []
    real_push = StreamDiffusion.push

    def push(self, image=None):
        seen.append(float(self.prompts.cond(False).control_scale[0, 0]))  # what the call takes
        return real_push(self, image)

    monkeypatch.setattr(StreamDiffusion, "push", push)
    (tmp_path / "s.txt").write_text("0 a red fox\n0 control_scales = 1.5\n0.5 control_scales = 0\n")
    common = ["render", "--model", "tiny", "--input", str(src), "--fps", "10", "--width", "32", "--height", "32",
              "--steps", "1", "--controlnet", str(controlnet_folder), "--control-preprocessor", "none",
              "--prompt-schedule", str(tmp_path / "s.txt"), "--transition", "0"]
    assert main([*common, "--output", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    assert seen == [1.5] * 5 + [0.0] * 3
    scheduled = [np.asarray(Image.open(f)) for f in sorted((tmp_path / "out").glob("*.png"))]
    (tmp_path / "flat.txt").write_text("0 a red fox\n0 control_scales = 1.5\n")
    assert main([*common[:-3], str(tmp_path / "flat.txt"), "--output", str(tmp_path / "flat")]) == 0
    flat = [np.asarray(Image.open(f)) for f in sorted((tmp_path / "flat").glob("*.png"))]
    assert len(scheduled) == len(flat) == 8
    assert all(np.array_equal(a, b) for a, b in zip(scheduled[:5], flat[:5]))
    assert all(not np.array_equal(a, b) for a, b in zip(scheduled[5:], flat[5:]))
    # a schedule the model cannot take fails before the run, in one line
    (tmp_path / "two.txt").write_text("0 control_scales = 1 1\n")
    assert main([*common[:-3], str(tmp_path / "two.txt"), "--output", str(tmp_path / "x")]) == 1
    assert "2 ControlNet scale(s) but the model has 1" in capsys.readouterr().err
    (tmp_path / "ip.txt").write_text("0 ip_adapter_scale = 1\n")
    assert main([*common[:-3], str(tmp_path / "ip.txt"), "--output", str(tmp_path / "x")]) == 1
    assert "no IP-Adapter" in capsys.readouterr().err
