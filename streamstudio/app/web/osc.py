"""OSC control (TouchDesigner, Resolume, lighting desks, Max, a phone app): a UDP port that
changes a running stream's settings, through the same checks as `POST /studio/settings/{stream}`.

    /streamstudio/{stream}/prompt    "a watercolor city"
    /streamstudio/{stream}/strength  0.6
    /streamstudio/{stream}/guidance  1.2              (guidance_scale)
    /streamstudio/{stream}/seed      7
    /streamstudio/{stream}/blend     "a cat" 0.7 "a dog" 0.3    prompts and weights
    /streamstudio/{stream}/blend     0.2 0.8          new weights for the stream's current blend
    /streamstudio/{stream}/{setting} value            any other live setting by its API name
                                                      (negative_prompt, delta, cfg_type, ...)
    /streamstudio/{stream}/control_scales 0.8 0.5     ControlNet scales, one per --controlnet
    /streamstudio/{stream}/ip_adapter_scale 0.6       the stream's IP-Adapter scale

`{stream}` is the session id (a WHIP stream's name, a `webrtc_id`); settings for a stream that
has not started yet are kept for it, as the API does.

Feedback, for a control surface that shows what runs:

    /streamstudio/{stream}/get        (no arguments) the stream's state, answered to the sender's
                                      address and port: the messages below
    /streamstudio/get                 the running streams: /streamstudio/streams "s1" "s2" ...
    --osc-feedback HOST:PORT          the state of every running stream sent there every 0.5 s

The state of one stream is one message per value, from the OSC port:

    /streamstudio/{stream}/fps         float   output frames per second now
    /streamstudio/{stream}/latency_ms  float   frame in to frame out (absent before the first)
    /streamstudio/{stream}/processed   int     frames out so far
    /streamstudio/{stream}/prompt      string  (a blend: /streamstudio/{stream}/blend "a" w "b" w)
    /streamstudio/{stream}/{setting}   value   every setting applied to the stream, by its API name
                                               (strength, guidance_scale, seed, control_scales ...)
    /streamstudio/{stream}/error       string  a `get` for a stream that is not running The server binds to 127.0.0.1 unless
`--osc-host` says otherwise: OSC has no login, so anyone who can reach the port can steer every
stream. A bad message is logged in one line and dropped; nothing it carries stops the server.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any

from streamstudio.app.web.sessions import SessionManager
from streamstudio.app.settings import CONTROL_SCALES, IP_ADAPTER_SCALE
from streamstudio.app.web.webrtc import WEBRTC_ID
from streamstudio.errors import StreamStudioError
from streamstudio.pipelines.live_settings import live_settings

log = logging.getLogger(__name__)

PREFIX = "streamstudio"
ALIASES = {"guidance": "guidance_scale", "negative": "negative_prompt", "filter": "similarity_filter",
           "threshold": "similarity_threshold", "cfg": "cfg_type"}
MAX_LOGGED = 120  # characters of a bad message shown in the log
FEEDBACK_INTERVAL = 0.5  # seconds between two state sends to --osc-feedback


def _number(value):
    """OSC floats are float32: 0.7 arrives as 0.699999988. Round to what a sender meant."""
    if isinstance(value, float) and math.isfinite(value):
        return float(f"{value:.6g}")
    return value


def settings_from_message(address: str, args: tuple, current_prompt=None) -> tuple[str, dict]:
    """(stream, raw settings) from one OSC message; StreamStudioError saying what is wrong.
    `current_prompt`: the stream's prompt now (a blend of weights only re-weights it)."""
    parts = address.strip("/").split("/")
    if len(parts) != 3 or parts[0] != PREFIX:
        raise StreamStudioError(f"address must be /{PREFIX}/<stream>/<setting>")
    _, stream, name = parts
    if not WEBRTC_ID.fullmatch(stream):
        raise StreamStudioError("the stream name must be 1 to 64 letters, digits, '-' or '_'")
    args = tuple(_number(a) for a in args)
    if name == "blend":
        return stream, {"prompt": _blend(args, current_prompt)}
    key = ALIASES.get(name, name)
    if key == CONTROL_SCALES:  # a list: one value per ControlNet (checked by the API's parser)
        return stream, {key: list(args)}
    if key == IP_ADAPTER_SCALE:
        if len(args) != 1:
            raise StreamStudioError(f"/{name} takes one value, got {len(args)}")
        return stream, {key: args[0]}
    table = {s.name: s for s in live_settings()}
    if key not in table:
        raise StreamStudioError(f"unknown setting {name!r}; known: {', '.join(sorted([*table, *ALIASES, 'blend']))}")
    if len(args) != 1:
        raise StreamStudioError(f"/{name} takes one value, got {len(args)}")
    value = args[0]
    kind = table[key].kind
    if kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    if kind is bool and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = bool(value)
    if kind in (int, float) and isinstance(value, bool):
        raise StreamStudioError(f"/{name} takes a number")
    return stream, {key: value}


def _blend(args: tuple, current) -> list:
    if args and all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in args):
        if not isinstance(current, (list, tuple)) or len(current) != len(args):
            raise StreamStudioError(f"/blend with {len(args)} weight(s) alone needs a current blend of as many "
                                    'prompts; send "prompt" weight pairs first')
        return [[text, float(w)] for (text, _), w in zip(current, args)]
    if len(args) % 2 or not args:
        raise StreamStudioError('/blend takes "prompt" weight pairs, or weights alone')
    return [[args[i], args[i + 1]] for i in range(0, len(args), 2)]


def state_messages(stream: str, stats: dict) -> list[tuple[str, list]]:
    """(address, arguments) of one stream's state (`StreamSession.stats()`), one value each."""
    base = f"/{PREFIX}/{stream}"
    out = [(f"{base}/fps", [float(stats["fps"])]), (f"{base}/processed", [int(stats["processed"])])]
    if stats.get("latency_ms") is not None:
        out.append((f"{base}/latency_ms", [float(stats["latency_ms"])]))
    for name, value in sorted((stats.get("settings") or {}).items()):
        args = _osc_args(value)
        if name == "prompt" and isinstance(value, list):
            out.append((f"{base}/blend", args))
        elif args:
            out.append((f"{base}/{name}", args))
    return out


def _osc_args(value: Any) -> list:
    """A setting's value as OSC arguments: numbers, strings and booleans as they are, a list or a
    blend flattened ([["a", 0.3], ["b", 0.7]] -> "a" 0.3 "b" 0.7); None: nothing."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [a for item in value for a in _osc_args(item)]
    if isinstance(value, (bool, int, float, str)):
        return [value]
    return [str(value)]


class OscControl:
    """The OSC server in a daemon thread: `OscControl(manager, port, host).close()`;
    `feedback` (host, port): where every running stream's state goes every FEEDBACK_INTERVAL s."""

    def __init__(self, manager: SessionManager, port: int, host: str = "127.0.0.1",
                 feedback: tuple[str, int] | None = None):
        try:
            from pythonosc.dispatcher import Dispatcher
            from pythonosc.osc_server import BlockingOSCUDPServer
        except ImportError:
            raise StreamStudioError("OSC control needs python-osc: pip install python-osc") from None
        if not 0 <= port <= 65535:
            raise StreamStudioError("--osc-port must be 0 to 65535")
        self.manager, self.feedback = manager, feedback
        self.received = self.applied = self.refused = self.sent = 0
        dispatcher = _at_once(Dispatcher)()
        dispatcher.set_default_handler(self.handle, needs_reply_address=True)
        try:
            self._server = BlockingOSCUDPServer((host, port), dispatcher)
        except OSError as exc:
            raise StreamStudioError(f"cannot open the OSC port {host}:{port}: {exc}; pick another --osc-port") from exc
        self.address = self._server.server_address[:2]
        self._thread = threading.Thread(target=self._serve, name="osc", daemon=True)
        self._thread.start()
        self._stop = threading.Event()
        self._feeder = None
        if feedback is not None:
            self._feeder = threading.Thread(target=self._feed, name="osc-feedback", daemon=True)
            self._feeder.start()

    def _serve(self) -> None:  # one thread: a packet's messages are applied in order, at once
        try:
            self._server.serve_forever(poll_interval=0.2)
        except Exception:  # pragma: no cover - the socket went away under it
            log.exception("the OSC server stopped")

    def handle(self, sender: tuple, address: str, *args) -> None:
        """One message: a query answered to `sender`, or settings applied through the settings
        checks; a bad one is logged in one line."""
        self.received += 1
        try:
            if address.rstrip("/").endswith("/get"):
                return self._answer(sender, address)
            current = None
            if address.rstrip("/").endswith("/blend"):
                session = self.manager.get(address.strip("/").split("/")[1]) if address.count("/") >= 2 else None
                current = session.stats()["settings"].get("prompt") if session is not None else None
            stream, raw = settings_from_message(address, args, current)
            self.manager.settings(stream, raw)
            self.applied += 1
        except StreamStudioError as exc:
            self.refused += 1
            log.warning("OSC %s %s refused: %s", address[:MAX_LOGGED], repr(args)[:MAX_LOGGED], exc)
        except Exception as exc:  # noqa: BLE001 - nothing a datagram carries stops the server
            self.refused += 1
            log.warning("OSC %s refused: %s: %s", address[:MAX_LOGGED], type(exc).__name__, str(exc)[:MAX_LOGGED])

    # ------------------------------------------------------------------ feedback
    def send(self, target: tuple, address: str, args: list) -> None:
        """One OSC message to `target` (host, port), from the OSC port (a reply comes back from
        where the control surface sent to)."""
        from pythonosc.osc_message_builder import OscMessageBuilder

        builder = OscMessageBuilder(address)
        for arg in args:
            builder.add_arg(arg)
        try:
            self._server.socket.sendto(builder.build().dgram, target[:2])
            self.sent += 1
        except OSError as exc:  # an unreachable target: said, not raised into the server
            log.debug("OSC feedback to %s: %s", target, exc)

    def stream_state(self, stream: str) -> list[tuple[str, list]]:
        session = self.manager.get(stream)
        if session is None or session.closed:
            return [(f"/{PREFIX}/{stream}/error", [f"no running stream {stream!r}"])]
        return state_messages(stream, session.stats())

    def _answer(self, sender: tuple, address: str) -> None:
        parts = address.strip("/").split("/")
        if parts == [PREFIX, "get"]:
            self.send(sender, f"/{PREFIX}/streams", list(self.manager.ids()))
            return
        if len(parts) != 3 or parts[0] != PREFIX or not WEBRTC_ID.fullmatch(parts[1]):
            raise StreamStudioError(f"a query is /{PREFIX}/get or /{PREFIX}/<stream>/get")
        for message in self.stream_state(parts[1]):
            self.send(sender, *message)

    def _feed(self) -> None:
        while not self._stop.wait(FEEDBACK_INTERVAL):
            for stream in self.manager.ids():
                try:
                    for message in self.stream_state(stream):
                        self.send(self.feedback, *message)
                except Exception:  # noqa: BLE001 - a stream ending under us: the next round
                    log.debug("OSC feedback for %s", stream, exc_info=True)

    def close(self) -> None:
        self._stop.set()
        if self._feeder is not None:
            self._feeder.join(5)
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def _at_once(dispatcher_class):
    """A python-osc Dispatcher that applies every message of a packet when it arrives. python-osc
    sleeps until a bundle's time tag before dispatching (OSC 1.0's scheduling), in the server's
    one thread: one bundle tagged an hour ahead stopped every later message. A live control's
    change is wanted now, so time tags (future, past or "immediately") are not waited for."""

    class AtOnce(dispatcher_class):
        def call_handlers_for_packet(self, data: bytes, client_address) -> list:
            from pythonosc import osc_packet

            try:
                packet = osc_packet.OscPacket(data)
            except osc_packet.ParseError:
                return []
            for timed in packet.messages:  # (bundles flattened, nested ones too)
                for handler in self.handlers_for_address(timed.message.address):
                    handler.invoke(client_address, timed.message)
            return []

    return AtOnce
