"""The two-deck routes (issue 48; app/web/decks.py), behind the publish credential like every
/studio route (`security.GuardConfig.control_prefixes`):

    POST   /studio/streams/{stream}/deck    {"model": NAME, "prompt": TEXT?, "negative_prompt": TEXT?,
                                             "loras": [PATH_OR_ID[:scale]]?, "controlnets": [ID_OR_PATH[:scale]]?,
                                             "control_preprocessors": [canny|depth|...]?,
                                             "ip_adapter": ID_OR_PATH[:scale]?, "ip_image": FILE?,
                                             "width": W?, "height": H?, "pipeline": "image"|"video"?}
                                            -> 202 {deck}: deck B loads in the background; the memory
                                            figures first, its add-ons' weights included (507 with
                                            them when it does not fit)
    GET    /studio/streams/{stream}/deck    -> {deck}: state (loading, warming, ready, switching,
                                            switched, error, unloaded), frames warmed, memory, error
    POST   /studio/streams/{stream}/switch  {"mode": "cut"|"fade", "seconds": 2.0, "on_beat": false}
                                            -> 202 {deck}: from the next frame (or the next beat)
    DELETE /studio/streams/{stream}/deck    -> deck B unloaded; deck A plays on

A stream is named as in the other routes (its id, or a WHIP publisher's or `--input` stream's name).
"""

from __future__ import annotations

from fastapi import Body
from fastapi.responses import JSONResponse

from streamstudio.app.web.decks import DeckBusy, DeckRefused, Decks, DeckSpec, Switch
from streamstudio.errors import StreamStudioError


def mount(app, manager) -> Decks:
    decks = Decks(manager)
    app.state.decks = decks

    def failed(error: str, status: int, **extra) -> JSONResponse:
        return JSONResponse({"status": "failed", "error": error, **extra}, status_code=status)

    def no_deck(stream: str) -> JSONResponse:
        return failed(f"stream {stream!r} has no deck" if manager.get(stream) else f"no stream {stream!r}", 404)

    # (plain functions: FastAPI runs them in its thread pool, off the event loop: the memory check reads files)
    @app.post("/studio/streams/{stream}/deck", tags=["perform"], status_code=202)
    def load_deck(stream: str, raw: dict = Body(...)):  # noqa: B008 - FastAPI's JSON body
        """Load deck B (a model, its own LoRAs, ControlNets, IP-Adapter and size; or a video model) beside the
        stream's model (memory checked first), warmed on the stream's frames."""
        try:
            deck = decks.load(stream, DeckSpec.parse(raw))
        except LookupError as exc:
            return failed(str(exc.args[0]), 404)
        except DeckRefused as exc:
            return failed(str(exc), 507, memory=exc.memory)
        except StreamStudioError as exc:
            return failed(str(exc), 409 if isinstance(exc, DeckBusy) else 400)
        return JSONResponse({"status": "loading", "deck": deck.to_json()}, status_code=202)

    @app.get("/studio/streams/{stream}/deck", tags=["perform"])
    def get_deck(stream: str):
        """Deck B's state, frames warmed and memory figures."""
        deck = decks.get(stream)
        if deck is None:
            return no_deck(stream)
        return {"deck": deck.to_json()}

    @app.post("/studio/streams/{stream}/switch", tags=["perform"], status_code=202)
    def switch(stream: str, raw: dict = Body(default={})):  # noqa: B008
        """Switch the stream to deck B: a cut or a cross-fade of N seconds, at once or on the next beat."""
        deck = decks.get(stream)
        if deck is None:
            return no_deck(stream)
        try:
            deck.ask_switch(Switch.parse(raw))
        except StreamStudioError as exc:
            return failed(str(exc), 409 if isinstance(exc, DeckBusy) else 400)
        return JSONResponse({"status": "switching", "deck": deck.to_json()}, status_code=202)

    @app.delete("/studio/streams/{stream}/deck", tags=["perform"])
    def unload_deck(stream: str):
        """Unload deck B before a switch; deck A plays on."""
        deck = decks.get(stream)
        if deck is None:
            return no_deck(stream)
        try:
            deck.unload()
        except StreamStudioError as exc:
            return failed(str(exc), 409)
        return {"status": "ok", "deck": deck.to_json()}

    return decks
