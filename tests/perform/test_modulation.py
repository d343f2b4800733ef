"""Live-performance control (app/perform/, issue 48): the tempo clock (set, tapped, MIDI clock),
LFO shapes, mappings through range, curve and smoothing, MIDI and audio readings, and the checks
on what a client sends. Expected values are worked out from the definitions (MIDI 1.0: 24 clock
pulses a quarter note; a one-pole filter's step response 1 - exp(-t / tau)), not from the code."""

from __future__ import annotations

import math

import pytest

from streamstudio.app.perform.modulation import Modulations, lfo
from streamstudio.app.perform.tempo import TempoClock
from streamstudio.errors import StreamStudioError


def test_tempo_set_tapped_and_from_midi_clock_keeps_the_beat_count_continuous():
    clock = TempoClock(120.0, origin=10.0)
    assert clock.beat(10.0) == 0.0 and clock.beat(11.0) == pytest.approx(2.0)  # 120 bpm: 2 beats a second
    clock.set_bpm(60.0, t=11.0)
    assert clock.beat(11.0) == pytest.approx(2.0) and clock.beat(12.0) == pytest.approx(3.0)  # no jump
    for k in range(4):  # taps every 0.4 s: 150 bpm, the last tap on a beat
        clock.tap(20.0 + 0.4 * k)
    assert clock.bpm == pytest.approx(150.0) and clock.source == "tap"
    assert clock.beat(21.2) % 1.0 == pytest.approx(0.0, abs=1e-9) and clock.beat(21.4) % 1.0 == pytest.approx(0.5)
    clock.tap(30.0)  # after a pause: a new count, the tempo kept until the next tap
    assert clock.bpm == pytest.approx(150.0)
    for k in range(49):  # MIDI clock at 100 bpm: a pulse every 60 / 100 / 24 s
        clock.midi_pulse(40.0 + k * 0.6 / 24)
    assert clock.bpm == pytest.approx(100.0) and clock.source == "midi"
    with pytest.raises(StreamStudioError, match="beats a minute"):
        clock.set_bpm(5000, t=0.0)


def test_lfo_shapes_at_known_phases():
    assert lfo("sine", 0.0) == pytest.approx(0.5) and lfo("sine", 0.25) == pytest.approx(1.0)
    assert lfo("sine", 0.75) == pytest.approx(0.0) and lfo("sine", 1.25) == pytest.approx(1.0)
    assert [lfo("triangle", p) for p in (0, 0.25, 0.5, 0.75)] == pytest.approx([0, 0.5, 1, 0.5])
    assert [lfo("square", p) for p in (0.1, 0.6)] == [1.0, 0.0] and lfo("saw", 2.3) == pytest.approx(0.3)


def test_an_lfo_drives_strength_through_its_range_and_curve():
    mods = Modulations.parse({"mappings": [
        {"setting": "strength", "source": {"kind": "lfo", "shape": "sine", "rate": 0.5}, "low": 0.2, "high": 0.8},
        {"setting": "guidance_scale", "source": {"kind": "lfo", "shape": "saw", "rate": 1.0}, "low": 1.0,
         "high": 3.0, "curve": "exp"},
        {"setting": "seed", "source": {"kind": "lfo", "shape": "square", "rate": 1.0}, "low": 0, "high": 10}]})
    at = mods.values(0.5)  # sine at 0.25 cycle: top; saw at 0.5: x^2 = 0.25; square in its low half
    assert at["strength"] == pytest.approx(0.8) and at["guidance_scale"] == pytest.approx(1.5)
    assert at["seed"] == 0 and isinstance(at["seed"], int)
    assert mods.values(1.5)["strength"] == pytest.approx(0.2)  # sine at 0.75 cycle: bottom


def test_lfo_in_beats_follows_the_tempo_clock():
    clock = TempoClock(120.0, origin=0.0)
    mods = Modulations.parse({"mappings": [
        {"setting": "delta", "source": {"kind": "lfo", "shape": "saw", "beats": 4}, "low": 0.0, "high": 2.0},
        {"setting": "strength", "source": {"kind": "beat"}, "low": 0.1, "high": 0.9}]})
    v = mods.values(1.0, clock)  # 2 beats in: half a 4-beat cycle; the beat's phase 0
    assert v["delta"] == pytest.approx(1.0) and v["strength"] == pytest.approx(0.1)
    assert mods.values(1.25, clock)["strength"] == pytest.approx(0.5)  # half a beat later


def test_smoothing_is_a_one_pole_filter():
    class Inputs:
        value = 0.0

        def cc(self, number, channel):
            return self.value

    inputs = Inputs()
    mods = Modulations.parse({"mappings": [{"setting": "delta", "source": {"kind": "midi", "cc": 74},
                                            "low": 0.0, "high": 1.0, "smoothing": 0.5}]})
    assert mods.values(0.0, inputs=inputs)["delta"] == 0.0
    inputs.value = 1.0  # a step from 0 to 1: after t the output is 1 - exp(-t / tau)
    assert mods.values(0.5, inputs=inputs)["delta"] == pytest.approx(1 - math.exp(-1))
    assert mods.values(1.0, inputs=inputs)["delta"] == pytest.approx(1 - math.exp(-2))


def test_a_source_without_a_reading_leaves_its_setting_alone():
    mods = Modulations.parse({"mappings": [{"setting": "delta", "source": {"kind": "midi", "cc": 1}},
                                           {"setting": "strength", "source": {"kind": "audio", "feature": "low"}}]})
    assert mods.values(3.0) == {}


def test_random_lfo_holds_a_value_a_cycle():
    mods = Modulations.parse({"mappings": [{"setting": "strength", "source": {"kind": "lfo", "shape": "random",
                                                                              "rate": 2.0}}]})
    a, b, c = (mods.values(t)["strength"] for t in (0.1, 0.4, 0.6))
    assert a == b and 0.0 <= a <= 1.0 and c != a  # one value for each half-second cycle


@pytest.mark.parametrize("raw, words", [
    ({"mappings": [{"setting": "prompt"}]}, "cannot be modulated"),
    ({"mappings": [{"setting": "strength", "low": 5}]}, "strength must be in"),
    ({"mappings": [{"setting": "strength", "source": {"kind": "laser"}}]}, "source is one of"),
    ({"mappings": [{"setting": "strength", "source": {"kind": "lfo", "rate": 0}}]}, "rate"),
    ({"mappings": [{"setting": "strength", "source": {"kind": "midi", "cc": 300}}]}, "cc is 0..127"),
    ({"mappings": [{"setting": "strength", "curve": "wiggly"}]}, "curve is one of"),
    ({"mappings": [{"setting": "strength", "smoothing": -1}]}, "smoothing"),
    ({"mappings": [{"setting": "strength", "colour": 1}]}, "has no colour"),
    ({"mappings": [{"setting": "strength"}] * 33}, "at most 32"),
    ([1, 2], "mappings"),
])
def test_bad_modulations_are_refused_with_a_clear_error(raw, words):
    with pytest.raises(StreamStudioError, match=words):
        Modulations.parse(raw)


def test_the_json_form_round_trips_with_defaults_filled_in():
    mods = Modulations.parse({"mappings": [{"setting": "ip_adapter_scale", "source": {"kind": "lfo"}}]})
    again = Modulations.parse(mods.to_json())
    assert again.mappings == mods.mappings
    assert mods.mappings[0].low == 0.0 and mods.mappings[0].high == 2.0  # the slider's range by default
    video = Modulations.parse({"mappings": [{"setting": "guidance"}]}, pipeline="video")  # the video table's rows
    assert video.mappings[0].setting == "guidance"
