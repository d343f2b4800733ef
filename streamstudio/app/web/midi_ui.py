"""The Live tab's MIDI (issue 48): a controller plugged into the performer's computer, read in
the browser through WebMIDI, and *learn*: pick a setting, press Learn, move a knob, bound.

The page's script (`MIDI_JS`, run by *Connect MIDI*: the browser asks the performer then, not
on every visit) asks for MIDI access once, listens to every input (and to inputs
plugged in later), and keeps the newest value of each control change (CC) it sees. About every
20 ms with something new it clicks a hidden button whose event hands the queued changes to the
server (`midi_event`): each becomes `LiveInputs.control_change`, what `POST /studio/midi` does,
so a mapping `{"kind": "midi", "cc": N}` applies it at the stream's next frame. While Learn is
armed, the first CC that arrives binds the chosen setting of the page's own stream to it
(`learn`: a mapping over the setting's slider range, replacing that setting's earlier one).
Everything goes through Gradio's events, so a page drives only the streams it owns, like its
sliders, with no credential in the page.
"""

from __future__ import annotations

import json

import gradio as gr

from streamstudio.app.perform.modulation import TABLES, modulatable
from streamstudio.app.web.perform_routes import set_mappings
from streamstudio.app.web.sessions import SessionManager
from streamstudio.errors import StreamStudioError

MAX_MESSAGES = 256  # control changes one event carries (the page keeps the newest of each CC)

MIDI_JS = """() => {
  if (window.__ssMidi) return;
  const m = window.__ssMidi = {queue: new Map(), learn: null, status: 'MIDI: asking the browser...', armed: false};
  const say = (text) => { m.status = text; const el = document.querySelector('#midi-status');
                          if (el) el.textContent = text; };
  // a click while the last one is still on its way may be dropped: look again until all is sent
  const flush = () => { const b = document.querySelector('#midi-send');
                        if (b && m.queue.size) { b.click(); setTimeout(flush, 50); } else { m.armed = false; } };
  m.take = () => { const out = [...m.queue.values()]; m.queue.clear();
                   if (m.learn && out.length) { out[out.length - 1].learn = m.learn; m.learn = null; }
                   return JSON.stringify(out); };
  const onMessage = (event) => {
    const [status, cc, value] = event.data;
    if ((status & 0xF0) !== 0xB0 || value === undefined) return;  // control changes only
    const channel = (status & 0x0F) + 1;
    m.queue.set(channel * 128 + cc, {cc: cc, value: value, channel: channel});
    if (!m.armed) { m.armed = true; setTimeout(flush, 20); }
  };
  const listen = (access) => {
    const names = [];
    for (const input of access.inputs.values()) { input.onmidimessage = onMessage; names.push(input.name); }
    say(names.length ? `MIDI: ${names.join(', ')}` : 'MIDI: no controller plugged in');
  };
  if (!navigator.requestMIDIAccess) { say('MIDI: this browser has no WebMIDI (Chrome, Edge and Opera do)'); return; }
  navigator.requestMIDIAccess().then((access) => {
    listen(access);
    access.onstatechange = () => listen(access);
  }, (err) => say(`MIDI: not allowed (${err && err.message ? err.message : err})`));
}"""

LEARN_JS = "(setting) => { if (!window.__ssMidi) document.querySelector('#midi-connect').click(); " \
           "setTimeout(() => { if (window.__ssMidi) window.__ssMidi.learn = setting; }, 0); return [setting]; }"
TAKE_JS = "(payload, rtc) => [window.__ssMidi ? window.__ssMidi.take() : '[]', rtc]"


def midi_controls(manager: SessionManager, webrtc, live_id) -> None:
    """The Live tab's MIDI accordion; `live_id(value)` is the page's stream id from the WebRTC
    component's value."""
    settings = list(modulatable(TABLES["image"]))
    with gr.Accordion("MIDI controller", open=False):
        with gr.Row():
            connect = gr.Button("Connect MIDI", elem_id="midi-connect", size="sm")
            gr.Markdown("MIDI: not connected", elem_id="midi-status")
        with gr.Row():
            setting = gr.Dropdown(settings, value="strength", label="setting", elem_id="midi-setting")
            learn_button = gr.Button("Learn", elem_id="midi-learn")
            clear = gr.Button("Clear mappings", elem_id="midi-clear")
        mapped = gr.Markdown("", elem_id="midi-mappings")
        payload = gr.Textbox(elem_classes=["ss-hidden"], container=False)
        send = gr.Button("send", elem_id="midi-send", elem_classes=["ss-hidden"])

    def on_learn(name, request: gr.Request):
        return f"Learn **{name}**: move a knob or fader"

    def on_send(raw, value, request: gr.Request):
        return midi_event(manager, raw, live_id(value), getattr(request, "session_hash", None))

    def on_clear(value, request: gr.Request):
        return clear_midi(manager, live_id(value), getattr(request, "session_hash", None))

    connect.click(None, js=MIDI_JS)  # the browser asks the performer once, on this click
    learn_button.click(on_learn, inputs=[setting], outputs=[mapped], js=LEARN_JS, queue=False)
    send.click(on_send, inputs=[payload, webrtc], outputs=[mapped], js=TAKE_JS, queue=False,
               show_progress="hidden", trigger_mode="always_last")
    clear.click(on_clear, inputs=[webrtc], outputs=[mapped], queue=False)


def midi_event(manager: SessionManager, raw: str, sid: str | None, owner: str | None) -> str:
    """The page's queued control changes (`MIDI_JS`'s JSON list of {cc, value, channel, learn?})
    applied; returns what the page shows under its MIDI controls."""
    inputs = manager.inputs
    if inputs is None:
        return "this server takes no performance input"
    try:
        messages = json.loads(raw or "[]")
    except ValueError:
        return "the page sent MIDI the server cannot read"
    if not isinstance(messages, list):
        return "the page sent MIDI the server cannot read"
    said = None
    for msg in messages[:MAX_MESSAGES]:
        if not isinstance(msg, dict):
            continue
        try:
            inputs.control_change(msg.get("cc"), msg.get("value"), msg.get("channel"))
            if msg.get("learn"):
                said = learn(manager, sid, owner, str(msg["learn"]), msg["cc"], msg.get("channel"))
        except StreamStudioError as exc:
            said = str(exc)
    return said if said is not None else gr.skip()


def learn(manager: SessionManager, sid: str | None, owner: str | None, setting: str, cc: int,
          channel: int | None) -> str:
    """Bind `setting` of the page's stream `sid` to MIDI `cc` on `channel`: a mapping over the
    setting's slider range, in place of the setting's earlier mapping. Returns the mappings."""
    session = manager.get(sid) if sid else None
    if sid is None or session is None or manager.inputs is None:
        raise StreamStudioError("start the stream first: Learn binds a knob to your live stream")
    if not manager.claim(sid, owner):
        raise StreamStudioError("this stream belongs to another page")
    old: list[dict] = session.modulations.to_json()["mappings"] if session.modulations else []
    mapping = {"setting": setting, "source": {"kind": "midi", "cc": int(cc), "channel": channel}}
    mods = set_mappings(manager, manager.inputs, sid, [m for m in old if m["setting"] != setting] + [mapping])
    return describe(mods.to_json() if mods else None)


def clear_midi(manager: SessionManager, sid: str | None, owner: str | None) -> str:
    """Drop the page's stream's MIDI mappings (the other sources' stay)."""
    session = manager.get(sid) if sid else None
    if sid is None or session is None or manager.inputs is None or not manager.claim(sid, owner):
        return "no live stream of this page"
    old: list[dict] = session.modulations.to_json()["mappings"] if session.modulations else []
    mods = set_mappings(manager, manager.inputs, sid, [m for m in old if m["source"]["kind"] != "midi"])
    return describe(mods.to_json() if mods else None)


def describe(mods: dict | None) -> str:
    """The MIDI mappings, one line each (`strength <- CC 74, channel 1`)."""
    lines = [f"- **{m['setting']}** <- CC {m['source']['cc']}"
             + (f", channel {m['source']['channel']}" if m["source"].get("channel") else "")
             for m in (mods or {}).get("mappings", []) if m["source"]["kind"] == "midi"]
    return "\n".join(lines) if lines else "no MIDI mappings"
