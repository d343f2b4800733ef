"""`serve --midi-in NAME` (app/perform/midi_port.py, issue 48): a controller on the server's own
machine, through mido, tested at mido's boundary with a fake backend (tests/fake_midi_backend.py:
mido's ports and messages, no ALSA sequencer here). Control changes reach the modulations' MIDI
sources (MIDI channels 1..16 where mido counts 0..15), MIDI clock sets the tempo (24 pulses a
quarter note, MIDI 1.0), a Start puts a downbeat on the next pulse, and a port that is not there
is refused with the ports that are."""

from __future__ import annotations

import pytest

mido = pytest.importorskip("mido")

import fake_midi_backend  # noqa: E402

from streamstudio.app.perform.inputs import LiveInputs  # noqa: E402
from streamstudio.app.perform.midi_port import MidiPort  # noqa: E402
from streamstudio.errors import StreamStudioError  # noqa: E402


@pytest.fixture
def backend():
    before = mido.backend
    mido.set_backend("fake_midi_backend", load=True)
    yield fake_midi_backend
    mido.backend = before


def test_control_changes_and_clock_from_a_server_port(backend, monkeypatch):
    inputs = LiveInputs()
    port = MidiPort(inputs, "fake knobs")  # a prefix, any case, as ALSA's numbered names need
    try:
        assert port.name == "Fake Knobs 20:0"
        backend.play(mido.Message("control_change", channel=0, control=74, value=127))
        backend.play(mido.Message("control_change", channel=9, control=7, value=0))
        assert inputs.cc(74, 1) == 1.0 and inputs.cc(7, 10) == 0.0 and inputs.cc(7, 1) is None
        backend.play(mido.Message("note_on", note=60))  # not a control: ignored
        assert port.messages == 2

        # 140 bpm of clock: a pulse every 60 / 140 / 24 s, on a clock the test holds
        t = [1000.0]
        monkeypatch.setattr("streamstudio.app.perform.midi_port.time.monotonic", lambda: t[0])
        for _ in range(3 * 24 + 7):  # the last 7 pulses: off the beat
            backend.play(mido.Message("clock"))
            t[0] += 60 / 140 / 24
        assert inputs.clock.bpm == pytest.approx(140, rel=1e-6) and inputs.clock.source == "midi"
        assert inputs.clock.beat(t[0]) % 1 != pytest.approx(0, abs=0.05)
        backend.play(mido.Message("start"))  # the DAW's play button: its next pulse is a downbeat
        backend.play(mido.Message("clock"))
        assert inputs.clock.beat(t[0]) % 1 == pytest.approx(0, abs=1e-9)
        assert inputs.clock.beat(t[0] + 60 / 140 / 2) % 1 == pytest.approx(0.5)  # half a beat later
    finally:
        port.close()
    backend.play(mido.Message("control_change", channel=0, control=74, value=0))  # closed: heard no more
    assert inputs.cc(74, 1) == 1.0


def test_a_missing_or_ambiguous_port_is_refused_with_the_ports_there_are(backend):
    with pytest.raises(StreamStudioError, match="no MIDI input .* 'Fake Knobs 20:0', 'Other Synth 24:0'"):
        MidiPort(LiveInputs(), "nanoKONTROL2")
    fake_midi_backend.NAMES.append("Fake Knobs 21:0")
    try:
        with pytest.raises(StreamStudioError, match="several MIDI input"):
            MidiPort(LiveInputs(), "Fake Knobs")
    finally:
        fake_midi_backend.NAMES.pop()


def test_serve_midi_in_feeds_the_server_and_a_wrong_port_is_refused_before_the_model(backend, capsys):
    import live_server

    from streamstudio.app import cli

    rc = cli.main(["serve", "--model", "no-such-model-here", "--midi-in", "nanoKONTROL2"])  # said first
    err = capsys.readouterr().err
    assert rc == 1 and "--midi-in 'nanoKONTROL2': no MIDI input" in err and "Fake Knobs 20:0" in err, err
    srv = live_server.start("--midi-in", "Fake Knobs")
    try:
        backend.play(mido.Message("control_change", channel=3, control=1, value=64))
        assert srv.manager.inputs.cc(1, 4) == pytest.approx(64 / 127)
    finally:
        srv.close()
    assert backend.OPEN == []  # the server's stop closed the port
