"""The live-performance routes (issue 48), behind the publish credential like every /studio route
(`security.GuardConfig.control_prefixes`):

    PUT    /studio/modulations/{stream}  {"mappings": [...], "latency_ms"?} -> {modulations, latency}: applied
                                         from the next frame
    GET    /studio/modulations/{stream}  -> {modulations (none: {"mappings": []}), latency}: the audio's
                                         latency offset in use, {"ms", "source": set | measured | assumed, ...}
    DELETE /studio/modulations/{stream}  -> the settings stay where the modulations left them
    GET    /studio/tempo                 -> {bpm, beat, source}
    PUT    /studio/tempo                 {"bpm": 128}
    POST   /studio/tempo/tap             -> {bpm, ...}: a tap on the beat (the second on sets the tempo)
    POST   /studio/midi                  {"cc": 74, "value": 0..127, "channel": 1..16?}: a control change,
                                         as the Live tab's WebMIDI forwards a knob
    GET    /studio/show                  -> the show: {"tempo": {"bpm"}, "streams": {name or "*": modulations}}
                                         (the modulations of the streams running, over the loaded show's)
    PUT    /studio/show                  a show (one file a show, `serve --show FILE`): the tempo now, each
                                         stream's modulations now if it runs, else when it opens

The modulation format is app/perform/modulation.py's; a stream is named as in the other routes
(its id, or a WHIP publisher's or `--input` stream's name).
"""

from __future__ import annotations

import time
import json

from fastapi import Body
from fastapi.responses import JSONResponse

from streamstudio.app.perform.inputs import LiveInputs
from streamstudio.app.perform.modulation import Modulations
from streamstudio.app.web import deck_routes
from streamstudio.errors import StreamStudioError


def set_modulations(manager, inputs: LiveInputs, stream: str, raw) -> Modulations | None:
    """Stream `stream`'s modulations from their JSON form (None or no mappings: none)."""
    session = manager.get(stream)
    if session is None:
        raise LookupError(f"no stream {stream!r}")
    mods = Modulations.parse(raw) if raw is not None else None
    if mods is not None and not mods.mappings:
        mods = None
    session.inputs, session.modulations = inputs, mods
    return mods


def set_mappings(manager, inputs: LiveInputs, stream: str, mappings: list[dict]) -> Modulations | None:
    """Stream `stream`'s mappings replaced by `mappings` (their JSON form), its set latency offset
    kept: what the Live tab's MIDI learn and mapping controls change."""
    session = manager.get(stream)
    latency = getattr(getattr(session, "modulations", None), "latency_ms", None)
    raw: dict = {"mappings": mappings}
    if latency is not None:
        raw["latency_ms"] = latency
    return set_modulations(manager, inputs, stream, raw)


OSC_ADDRESSES = ("/streamstudio/tempo", "/streamstudio/tap", "/streamstudio/midi")  # and /{stream}/modulations


def osc_message(manager, address: str, args: tuple) -> bool:
    """OSC's side of these routes (app/web/osc.py): `/streamstudio/tempo BPM`, `/streamstudio/tap`,
    `/streamstudio/midi CC VALUE [CHANNEL]`, `/streamstudio/{stream}/modulations "JSON"`. Returns
    False for another address; a bad message is a StreamStudioError."""
    inputs: LiveInputs | None = getattr(manager, "inputs", None)
    address = address.rstrip("/")
    if address not in OSC_ADDRESSES and not address.endswith("/modulations"):
        return False
    if inputs is None:
        raise StreamStudioError("this server takes no performance input")
    now = time.monotonic()
    if address == "/streamstudio/tempo" and len(args) == 1:
        inputs.clock.set_bpm(args[0], now)
    elif address == "/streamstudio/tap" and not args:
        inputs.clock.tap(now)
    elif address == "/streamstudio/midi" and len(args) in (2, 3):
        inputs.control_change(*args)
    elif address.count("/") == 3 and len(args) == 1 and isinstance(args[0], str):
        try:
            raw = json.loads(args[0]) if args[0].strip() else None
        except ValueError as exc:
            raise StreamStudioError(f"modulations are a JSON string ({exc})") from None
        try:
            set_modulations(manager, inputs, address.split("/")[2], raw)
        except LookupError as exc:
            raise StreamStudioError(str(exc.args[0])) from None
    else:
        raise StreamStudioError(f"{address} takes: /streamstudio/tempo BPM, /streamstudio/tap, /streamstudio/midi "
                                "CC VALUE [CHANNEL], /streamstudio/{stream}/modulations JSON")
    return True


def mount(app, manager, inputs: LiveInputs) -> None:
    def failed(error: str, status: int) -> JSONResponse:
        return JSONResponse({"status": "failed", "error": error}, status_code=status)

    @app.put("/studio/modulations/{stream}", tags=["perform"])
    async def put_modulations(stream: str, raw: dict = Body(...)):  # noqa: B008 - FastAPI's JSON body
        try:
            mods = set_modulations(manager, inputs, stream, raw)
        except LookupError as exc:
            return failed(str(exc.args[0]), 404)
        except StreamStudioError as exc:
            return failed(str(exc), 400)
        return {"status": "ok", "modulations": mods.to_json() if mods else {"mappings": []},
                "latency": inputs.latency.offset(stream)}

    @app.get("/studio/modulations/{stream}", tags=["perform"])
    async def get_modulations(stream: str):
        session = manager.get(stream)
        if session is None:
            return failed(f"no stream {stream!r}", 404)
        mods = session.modulations
        return {"modulations": mods.to_json() if mods else {"mappings": []}, "latency": inputs.latency.offset(stream)}

    @app.delete("/studio/modulations/{stream}", tags=["perform"])
    async def delete_modulations(stream: str):
        try:
            set_modulations(manager, inputs, stream, None)
        except LookupError as exc:
            return failed(str(exc.args[0]), 404)
        return {"status": "ok"}

    @app.get("/studio/tempo", tags=["perform"])
    async def tempo():
        return inputs.clock.state(time.monotonic())

    @app.put("/studio/tempo", tags=["perform"])
    async def set_tempo(raw: dict = Body(...)):  # noqa: B008
        try:
            inputs.clock.set_bpm(raw.get("bpm"), time.monotonic())
        except StreamStudioError as exc:
            return failed(str(exc), 400)
        return inputs.clock.state(time.monotonic())

    @app.post("/studio/tempo/tap", tags=["perform"])
    async def tap():
        now = time.monotonic()
        inputs.clock.tap(now)
        return inputs.clock.state(now)

    @app.get("/studio/show", tags=["perform"])
    async def get_show():
        show = inputs.show()
        for sid in manager.ids():
            session = manager.get(sid)
            if session is not None and session.modulations is not None:
                show["streams"][sid] = session.modulations.to_json()
        return show

    @app.put("/studio/show", tags=["perform"])
    async def put_show(raw: dict = Body(...)):  # noqa: B008
        try:
            show = inputs.load_show(raw)
        except StreamStudioError as exc:
            return failed(str(exc), 400)
        for sid in manager.ids():
            session = manager.get(sid)
            if session is not None:
                session.inputs, session.modulations = inputs, inputs.show_for(sid)
        return {"status": "ok", "show": show}

    @app.post("/studio/midi", tags=["perform"])
    async def midi(raw: dict = Body(...)):  # noqa: B008
        try:
            value = inputs.control_change(raw.get("cc"), raw.get("value"), raw.get("channel"))
        except StreamStudioError as exc:
            return failed(str(exc), 400)
        return {"status": "ok", "cc": raw.get("cc"), "value": value}

    deck_routes.mount(app, manager)  # two decks: POST /studio/streams/{stream}/deck, .../switch
