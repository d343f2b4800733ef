"""Prompt schedules: parsing (text, YAML, JSON), blending over the transition, errors."""

from __future__ import annotations

import pytest

from streamstudio.errors import StreamStudioError
from streamstudio.streaming.schedule import (
    PromptKey,
    PromptSchedule,
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
    (tmp_path / "s.yaml").write_text("transition: 0.5\nprompts:\n  - {at: 0, prompt: one}\n  - {at: '0:01', prompt: two}\n")
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
