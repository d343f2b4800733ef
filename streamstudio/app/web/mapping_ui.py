"""The Live tab's mappings from sources other than MIDI (issue 48): a performer binds any numeric
live setting of the page's own stream to a feature of its audio (rms, low, mid, high, onset), an
LFO (a shape at a rate in Hz or a cycle every so many beats) or the tempo's beat phase, with a
range (empty: the setting's slider range), a curve and smoothing; sees the stream's mappings
(every kind, those set by the API, OSC, a show or MIDI learn too) and the audio's latency offset;
and removes one. Each change goes through `perform_routes.set_mappings`, the code `PUT
/studio/modulations/{stream}` runs, so it is checked the same way; like the page's sliders it
drives only the streams the page owns, with no credential in the page.
"""

from __future__ import annotations

import gradio as gr

from streamstudio.app.perform.modulation import CURVES, FEATURES, SHAPES, TABLES, modulatable
from streamstudio.app.web.perform_routes import set_mappings
from streamstudio.app.web.sessions import SessionManager
from streamstudio.errors import StreamStudioError

LFO, BEAT = "LFO", "tempo (beat phase)"
SOURCES = tuple(f"audio: {f}" for f in FEATURES) + (LFO, BEAT)
UNITS = ("Hz", "beats")  # an LFO's rate: cycles a second, or beats a cycle (of the tempo clock)
NO_STREAM = "no live stream of this page: start the camera first"


def mapping_controls(manager: SessionManager, webrtc, live_id) -> None:
    """The Live tab's *Modulations* accordion; `live_id(value)` is the page's stream id from the
    WebRTC component's value."""
    settings = list(modulatable(TABLES["image"]))
    with gr.Accordion("Modulations: audio, LFO, tempo", open=False):
        with gr.Row():
            setting = gr.Dropdown(settings, value="guidance_scale", label="setting", elem_id="mod-setting")
            source = gr.Dropdown(list(SOURCES), value=LFO, label="source", elem_id="mod-source")
            shape = gr.Dropdown(list(SHAPES), value="sine", label="LFO shape", elem_id="mod-shape")
        with gr.Row():
            rate = gr.Number(1.0, label="rate (LFO; beats: the beat's ramp)", minimum=0, elem_id="mod-rate")
            unit = gr.Radio(list(UNITS), value="beats", label="rate in", elem_id="mod-unit")
            smoothing = gr.Number(0.0, label="smoothing (s)", minimum=0, elem_id="mod-smoothing")
        with gr.Row():
            low = gr.Number(None, label="low (empty: the slider's)", elem_id="mod-low")
            high = gr.Number(None, label="high (empty: the slider's)", elem_id="mod-high")
            curve = gr.Dropdown(list(CURVES), value="linear", label="curve", elem_id="mod-curve")
        with gr.Row():
            add = gr.Button("Add mapping", elem_id="mod-add")
            pick = gr.Dropdown([], label="mapping", elem_id="mod-pick", allow_custom_value=True)
            remove = gr.Button("Remove", elem_id="mod-remove")
        shown = gr.Markdown(NO_STREAM, elem_id="mod-mappings")

    def owner(request) -> str | None:
        return getattr(request, "session_hash", None)

    def on_add(value, setting_, source_, shape_, rate_, unit_, low_, high_, curve_, smoothing_, request: gr.Request):
        said = add_mapping(manager, live_id(value), owner(request), setting_, source_, shape_, rate_, unit_, low_,
                           high_, curve_, smoothing_)
        return said, gr.update(choices=labels(manager, live_id(value)))

    def on_remove(value, label, request: gr.Request):
        said = remove_mapping(manager, live_id(value), owner(request), label)
        return said, gr.update(choices=labels(manager, live_id(value)), value=None)

    def on_tick(value, request: gr.Request):
        return show(manager, live_id(value), owner(request))

    fields = [setting, source, shape, rate, unit, low, high, curve, smoothing]
    add.click(on_add, inputs=[webrtc, *fields], outputs=[shown, pick], queue=False)
    remove.click(on_remove, inputs=[webrtc, pick], outputs=[shown, pick], queue=False)
    gr.Timer(2.0).tick(on_tick, inputs=[webrtc], outputs=[shown], show_progress="hidden", queue=False)


def mapping_json(setting: str, source: str, shape: str = "sine", rate=1.0, unit: str = "beats", low=None, high=None,
                 curve: str = "linear", smoothing=0.0) -> dict:
    """A mapping's JSON form (app/perform/modulation.py) from the controls' values; a range end
    left empty takes the setting's slider range."""
    if source.startswith("audio: "):
        src: dict = {"kind": "audio", "feature": source[len("audio: "):]}
    elif source in (LFO, BEAT):
        if unit not in UNITS:
            raise StreamStudioError(f"a rate is in {' or '.join(UNITS)}, got {unit!r}")
        src = {"kind": "lfo", "shape": shape} if source == LFO else {"kind": "beat"}
        if rate is None or rate <= 0:
            raise StreamStudioError("give the rate: over 0 Hz, or beats a cycle")
        if unit == "beats":
            src["beats"] = float(rate)
        elif source == LFO:
            src["rate"] = float(rate)
        else:
            raise StreamStudioError("the beat's ramp is so many beats long: give the rate in beats")
    else:
        raise StreamStudioError(f"a source is one of {', '.join(SOURCES)}, got {source!r}")
    out = {"setting": setting, "source": src, "curve": curve, "smoothing": float(smoothing or 0.0)}
    out.update({k: float(v) for k, v in (("low", low), ("high", high)) if v is not None})
    return out


def add_mapping(manager: SessionManager, sid: str | None, owner: str | None, setting: str, source: str,
                shape: str = "sine", rate=1.0, unit: str = "beats", low=None, high=None, curve: str = "linear",
                smoothing=0.0) -> str:
    """Bind `setting` of the page's stream to `source`, in place of the setting's earlier mapping;
    returns what the page shows (the mappings, or why not)."""
    old = _own(manager, sid, owner)
    if old is None:
        return NO_STREAM
    try:
        mapping = mapping_json(setting, source, shape, rate, unit, low, high, curve, smoothing)
        assert manager.inputs is not None and sid is not None  # (_own checked both)
        set_mappings(manager, manager.inputs, sid, [m for m in old if m["setting"] != setting] + [mapping])
    except StreamStudioError as exc:
        return f"not added: {exc}\n\n{show(manager, sid, owner)}"
    return show(manager, sid, owner)


def remove_mapping(manager: SessionManager, sid: str | None, owner: str | None, label: str | None) -> str:
    """Drop the mapping `label` names (as `labels` gives them: "2. strength <- LFO sine, 4 beats")."""
    old = _own(manager, sid, owner)
    if old is None:
        return NO_STREAM
    number = (label or "").split(".", 1)[0]
    if not number.isdigit() or not 1 <= int(number) <= len(old):
        return f"pick a mapping to remove\n\n{show(manager, sid, owner)}"
    assert manager.inputs is not None and sid is not None
    set_mappings(manager, manager.inputs, sid, old[:int(number) - 1] + old[int(number):])
    return show(manager, sid, owner)


def labels(manager: SessionManager, sid: str | None) -> list[str]:
    """The page's stream's mappings, one line each, numbered from 1."""
    session = manager.get(sid) if sid else None
    mods = getattr(session, "modulations", None)
    return [f"{i}. {_line(m)}" for i, m in enumerate(mods.to_json()["mappings"] if mods else [], 1)]


def show(manager: SessionManager, sid: str | None, owner: str | None) -> str:
    """What the page shows: the mappings and, when one reads audio, the audio's latency offset."""
    if _own(manager, sid, owner) is None:
        return NO_STREAM
    lines = labels(manager, sid)
    if not lines:
        return "no mappings"
    text = "\n".join(f"- {line}" for line in lines)
    session = manager.get(sid) if sid else None
    if manager.inputs is not None and sid is not None and session is not None and session.modulations is not None \
            and session.modulations.uses("audio"):
        offset = manager.inputs.latency.offset(sid)
        text += f"\n\naudio read {offset['ms']:.0f} ms behind its capture ({offset['source']})"
    return text


def _line(m: dict) -> str:
    s = m["source"]
    if s["kind"] == "audio":
        what = f"audio {s['feature']}"
    elif s["kind"] == "midi":
        what = f"CC {s['cc']}" + (f", channel {s['channel']}" if s.get("channel") else "")
    elif s["kind"] == "beat":
        what = f"beat phase, {s['beats']:g} beats"
    else:
        what = f"LFO {s['shape']}, " + (f"{s['beats']:g} beats" if s.get("beats") else f"{s['rate']:g} Hz")
    extra = "".join([f", {m['curve']}" if m["curve"] != "linear" else "", ", inverted" if m["invert"] else "",
                     f", smoothing {m['smoothing']:g} s" if m["smoothing"] else ""])
    return f"{m['setting']} <- {what}, {m['low']:g}..{m['high']:g}{extra}"


def _own(manager: SessionManager, sid: str | None, owner: str | None) -> list[dict] | None:
    """The mappings (JSON) of the page's stream `sid`, [] for none; None when the page has no such
    stream or it is another page's."""
    session = manager.get(sid) if sid else None
    if sid is None or session is None or manager.inputs is None or not manager.claim(sid, owner):
        return None
    return session.modulations.to_json()["mappings"] if session.modulations else []
