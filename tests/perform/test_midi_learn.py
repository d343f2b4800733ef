"""MIDI in the Live tab (app/web/midi_ui.py, issue 48): *learn* binds a setting of the page's own
stream to the first knob moved, and every knob after drives it at the next frame. First on the
server's side (the event a page's queued control changes arrive in), then in Debian's Chromium
with a fake WebMIDI controller injected into the page (navigator.requestMIDIAccess replaced before
the app loads), the fake camera streaming through the tiny model."""

from __future__ import annotations

import json

import pytest
from browser import chromium_page, needs_chromium, start_live_stream, wait_until
from helpers import feed_frames

from streamstudio.app.settings import live_controls
from streamstudio.app.web.midi_ui import clear_midi, midi_event
from streamstudio.pipelines.image.stream_diffusion import StreamDiffusionConfig

pytestmark = pytest.mark.timeout(300)

# the ends of the strength slider the performer sees in the Live tab: a knob at 0 gives its low
# end, at 127 its high end (docs/performance.md: a mapping's range defaults to the slider's)
_SLIDER = live_controls(StreamDiffusionConfig(), "a prompt", "")["strength"]
LOW, HIGH = _SLIDER.minimum, _SLIDER.maximum

# A controller named "Fake Controller" with one input; window.__cc(cc, value, channel) moves a knob
# (a control change: status 0xB0 + channel - 1), as a USB controller's driver would deliver it.
FAKE_MIDI = """
(() => {
  const input = {id: 'fake-1', name: 'Fake Controller', manufacturer: 'tests', state: 'connected',
                 type: 'input', onmidimessage: null};
  const access = {inputs: new Map([['fake-1', input]]), outputs: new Map(), sysexEnabled: false,
                  onstatechange: null};
  navigator.requestMIDIAccess = () => Promise.resolve(access);
  window.__cc = (cc, value, channel) => {
    if (input.onmidimessage) input.onmidimessage({data: new Uint8Array([0xB0 + channel - 1, cc, value])});
    return !!input.onmidimessage;
  };
})();
"""


@pytest.fixture(scope="module")
def server():
    import live_server

    srv = live_server.start()
    yield srv
    srv.close()


def feed(session, frames: int) -> None:
    feed_frames(session, frames, step=13)


def test_learn_binds_the_first_knob_and_the_knob_drives_the_setting(server):
    manager = server.manager
    session = manager.open("midi-a")
    try:
        feed(session, 2)
        said = midi_event(manager, json.dumps([{"cc": 21, "value": 127, "channel": 2, "learn": "strength"}]),
                          "midi-a", "page-a")
        assert "strength" in said and "CC 21" in said and "channel 2" in said, said
        feed(session, 2)
        assert session.stats()["settings"]["strength"] == pytest.approx(HIGH)
        midi_event(manager, json.dumps([{"cc": 21, "value": 0, "channel": 2}]), "midi-a", "page-a")
        feed(session, 2)
        assert session.stats()["settings"]["strength"] == pytest.approx(LOW)
        midi_event(manager, json.dumps([{"cc": 21, "value": 0, "channel": 3}]), "midi-a", "page-a")
        assert manager.inputs.cc(21, 2) == 0.0  # another channel's knob is another knob

        # learning again rebinds the setting (one mapping a setting); another page may not
        said = midi_event(manager, json.dumps([{"cc": 7, "value": 64, "channel": 1, "learn": "strength"}]),
                          "midi-a", "page-a")
        assert "CC 7" in said and "CC 21" not in said, said
        said = midi_event(manager, json.dumps([{"cc": 9, "value": 1, "channel": 1, "learn": "delta"}]),
                          "midi-a", "page-b")
        assert "another page" in said and len(session.modulations.mappings) == 1
        assert midi_event(manager, "not json", "midi-a", "page-a") == "the page sent MIDI the server cannot read"
        assert "start the stream" in midi_event(manager, json.dumps([{"cc": 1, "value": 1, "learn": "strength"}]),
                                                None, "page-a")
        assert "cannot be modulated" in midi_event(
            manager, json.dumps([{"cc": 1, "value": 1, "learn": "prompt"}]), "midi-a", "page-a")
        assert clear_midi(manager, "midi-a", "page-a") == "no MIDI mappings" and session.modulations is None
    finally:
        manager.close("midi-a")


def midi_page():
    """A page with the fake WebMIDI controller injected (FAKE_MIDI) before the app's scripts."""
    return chromium_page(viewport={"width": 1280, "height": 1400}, init_script=FAKE_MIDI)


@needs_chromium
def test_a_fake_controller_in_chromium_learns_and_drives_the_live_stream(server):
    manager = server.manager
    with midi_page() as page:
        session = start_live_stream(page, server)

        page.get_by_text("MIDI controller").click()
        page.locator("#midi-connect").click()
        wait_until(page, lambda: "Fake Controller" in page.locator("#midi-status").inner_text(),
                   what="the page to list the controller")
        page.locator("#midi-learn").click()  # the dropdown's default: strength
        wait_until(page, lambda: "move a knob" in page.locator("#midi-mappings").inner_text(), what="learn armed")
        assert page.evaluate("window.__cc(74, 127, 1)")
        wait_until(page, lambda: session.modulations is not None, what="the knob bound on the server")
        mapping = session.modulations.mappings[0]
        assert (mapping.setting, mapping.source.kind, mapping.source.cc, mapping.source.channel) == \
            ("strength", "midi", 74, 1)
        wait_until(page, lambda: "CC 74" in page.locator("#midi-mappings").inner_text(), what="the page shows it")
        wait_until(page, lambda: session.stats()["settings"].get("strength") == pytest.approx(HIGH),
                   what="knob at 127: the slider's high end")
        page.evaluate("window.__cc(74, 0, 1)")  # the knob down: the next frames at the low end
        wait_until(page, lambda: session.stats()["settings"].get("strength") == pytest.approx(LOW),
                   what="knob at 0: the slider's low end")
        for value in range(0, 128, 8):  # a sweep: the newest value wins, nothing breaks
            page.evaluate(f"window.__cc(74, {value}, 1)")
        wait_until(page, lambda: manager.inputs.cc(74, 1) == pytest.approx(120 / 127),
                   what=f"the sweep's end: {manager.inputs.cc(74, 1)} {page.evaluate('window.__ssMidi.queue.size')}")
