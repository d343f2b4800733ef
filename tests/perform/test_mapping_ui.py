"""The Live tab's audio, LFO and tempo mappings (app/web/mapping_ui.py, issue 48): a performer adds
and removes mappings of the page's own stream, sees every mapping it has (MIDI-learned and API-set
ones too) and the audio's latency offset; each change is what `PUT /studio/modulations/{stream}`
makes of the same JSON. First the page's events called on the server, then in Chromium (the fake
camera streaming through the tiny model): Add with the controls' defaults, then Remove."""

from __future__ import annotations

import json

import httpx
import pytest
from browser import chromium_page, needs_chromium, start_live_stream, wait_until
from helpers import feed_frames

from streamstudio.app.web.mapping_ui import BEAT, LFO, NO_STREAM, add_mapping, labels, remove_mapping, show
from streamstudio.app.web.midi_ui import midi_event
from streamstudio.app.web.perform_routes import set_modulations

pytestmark = pytest.mark.timeout(300)



@pytest.fixture(scope="module")
def server():
    import live_server

    srv = live_server.start()
    yield srv
    srv.close()


def test_audio_lfo_and_beat_mappings_are_added_shown_and_removed(server):
    manager, name, page = server.manager, "map-a", "page-a"
    session = manager.open(name)
    try:
        feed_frames(session, 2, step=19)
        said = add_mapping(manager, name, page, "guidance_scale", "audio: low", low=1.0, high=2.5)
        assert "guidance_scale <- audio low, 1..2.5" in said and "ms behind its capture (" in said, said
        said = add_mapping(manager, name, page, "strength", LFO, "triangle", 4, "beats", 0.3, 0.8, "smooth", 0.1)
        assert "strength <- LFO triangle, 4 beats, 0.3..0.8, smooth, smoothing 0.1 s" in said, said
        add_mapping(manager, name, page, "delta", LFO, "sine", 2.0, "Hz", 0.0, 2.0)
        add_mapping(manager, name, page, "seed", BEAT, rate=8, unit="beats", low=0, high=1000)
        # what PUT /studio/modulations makes of the same JSON (the route reads back what the page set)
        got = httpx.get(f"{server.url}/studio/modulations/{name}", timeout=10).json()["modulations"]["mappings"]
        assert [(m["setting"], m["source"]["kind"]) for m in got] == \
            [("guidance_scale", "audio"), ("strength", "lfo"), ("delta", "lfo"), ("seed", "beat")]
        assert got[1]["source"]["beats"] == 4 and got[2]["source"]["rate"] == 2.0 and got[2]["source"]["beats"] is None
        assert got[3]["source"]["beats"] == 8 and got[1]["curve"] == "smooth" and got[1]["smoothing"] == 0.1
        put = httpx.put(f"{server.url}/studio/modulations/{name}", json={"mappings": got}, timeout=10).json()
        assert put["modulations"]["mappings"] == got

        feed_frames(session, 3, step=19)  # the LFOs and the beat drive their settings from the next frame
        applied = session.stats()["settings"]
        assert 0.3 <= applied["strength"] <= 0.8 and 0.0 <= applied["delta"] <= 2.0 and 0 <= applied["seed"] <= 1000
        assert "guidance_scale" not in applied  # no audio yet: left where it was

        # one mapping a setting: adding again replaces it; a MIDI-learned one shows too
        add_mapping(manager, name, page, "strength", "audio: onset")
        midi_event(manager, json.dumps([{"cc": 21, "value": 64, "channel": 2, "learn": "bank_fusion"}]), name, page)
        listed = labels(manager, name)
        assert len(listed) == 5 and listed[-2].startswith("4. strength <- audio onset, ") and \
            listed[-1] == "5. bank_fusion <- CC 21, channel 2, 0..1", listed

        # refused, with the reason, and nothing changed
        for args, words in ((("delta", LFO, "sine", 0, "Hz"), "give the rate"),
                            (("prompt", LFO), "cannot be modulated"),
                            (("delta", BEAT, "sine", 1, "Hz"), "give the rate in beats"),
                            (("delta", "audio: low", "sine", 1, "beats", 0.0, 99.0), "delta")):
            said = add_mapping(manager, name, page, *args)
            assert said.startswith("not added: ") and words in said, (args, said)
        assert len(session.modulations.mappings) == 5
        assert add_mapping(manager, name, "page-b", "delta", LFO) == NO_STREAM  # another page's stream
        assert add_mapping(manager, name, page, "delta", "wind").startswith("not added: a source is one of")
        assert show(manager, None, page) == NO_STREAM

        said = remove_mapping(manager, name, page, listed[0])
        assert "guidance_scale" not in said and len(session.modulations.mappings) == 4
        assert remove_mapping(manager, name, page, "9. nothing").startswith("pick a mapping to remove")

        # a latency offset set by the API stays through the page's changes
        set_modulations(manager, manager.inputs, name, {**session.modulations.to_json(), "latency_ms": 180})
        add_mapping(manager, name, page, "guidance_scale", "audio: rms")
        assert session.modulations.latency_ms == 180 and "audio read 180 ms behind its capture (set)" in \
            show(manager, name, page)
        for _ in labels(manager, name):
            said = remove_mapping(manager, name, page, labels(manager, name)[0])
        assert said == "no mappings" and session.modulations is None
    finally:
        manager.close(name)


@needs_chromium
def test_a_mapping_is_added_and_removed_in_chromium(server):
    with chromium_page(viewport={"width": 1280, "height": 1600}) as page:
        session = start_live_stream(page, server)

        page.get_by_text("Modulations: audio, LFO, tempo").click()
        page.locator("#mod-add").click()  # the controls' defaults: guidance_scale <- an LFO, a sine a beat
        wait_until(page, lambda: session.modulations is not None, what="the mapping set on the server")
        mapping = session.modulations.mappings[0]
        assert (mapping.setting, mapping.source.kind, mapping.source.shape, mapping.source.beats) == \
            ("guidance_scale", "lfo", "sine", 1.0)
        wait_until(page, lambda: "guidance_scale <- LFO sine, 1 beats" in page.locator("#mod-mappings").inner_text(),
                   what="the page shows it")
        wait_until(page, lambda: "guidance_scale" in session.stats()["settings"], what="the LFO drives it")

        page.locator("#mod-pick input").click()
        page.get_by_role("option", name="1. guidance_scale <- LFO sine, 1 beats", exact=False).click()
        page.locator("#mod-remove").click()
        wait_until(page, lambda: session.modulations is None, what="the mapping removed on the server")
        wait_until(page, lambda: "no mappings" in page.locator("#mod-mappings").inner_text(), what="the page says so")
