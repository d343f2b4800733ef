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

`{stream}` is the stream's id, the one that controls it (a WHIP stream's name, a `webrtc_id`);
settings for a stream that has not started yet are kept for it, as the API does. Outputs, as
`POST /studio/outputs/{stream}` starts them (app/web/outputs.py):

    /streamstudio/{stream}/output      "rtmp" "rtmp://host/live/key" [30]   KIND TARGET [FPS]
    /streamstudio/{stream}/output_stop ["ID"]    that output, or every output of the stream

Live performance (app/web/perform_routes.py, as its HTTP routes):

    /streamstudio/tempo      128                    the tempo, beats a minute
    /streamstudio/tap                                a tap on the beat
    /streamstudio/midi       74 100 [1]              a MIDI control change: CC VALUE [CHANNEL]
    /streamstudio/{stream}/modulations '{"mappings": [...]}'   the stream's modulations ("": none)

Feedback, for a control surface that shows what runs:

    /streamstudio/{stream}/get        the stream's state, answered to the packet's source address
                                      and port; {stream}: its id or its watch id
    /streamstudio/get                 the running streams' public names: /streamstudio/streams "stage" "w1" ...
    --osc-feedback HOST:PORT          the state of every running stream sent there every 0.5 s

The state of one stream is one message per value, from the OSC port. A reply names a stream by
its public name: a named stream's own name (a WHIP publisher's URL, `serve --input`'s stream),
else its watch id (the name WHEP viewers watch it by, `/whep/<watch id>`), never by the secret id
that controls a page's stream, so no reply (nor a forged packet's reply, below) gives one away:

    /streamstudio/{watch id}/fps         float   output frames per second now
    /streamstudio/{watch id}/latency_ms  float   frame in to frame out (absent before the first)
    /streamstudio/{watch id}/processed   int     frames out so far
    /streamstudio/{watch id}/prompt      string  (a blend: /streamstudio/{watch id}/blend "a" w "b" w)
    /streamstudio/{watch id}/{setting}   value   every live setting by its API name, those at the
                                                 server's defaults too (strength, guidance_scale,
                                                 seed, cfg_type, ..., control_scales with ControlNets)
    /streamstudio/error                  string  a `get` for no running stream ("no such stream"),
                                                 or a reply over its cap ("pad to N bytes")

A packet's source address can be forged (UDP), so a reply must not make the OSC port a reflector:
all the datagrams answering one packet together are at most REPLY_FACTOR (2) times that packet's
size, and a reply that would be larger is refused with one "pad to N bytes" error (itself under
the cap: 44 bytes, which the smallest query, a 24-byte `/streamstudio/get`, allows; nothing is sent
when even that is over). A control surface pads its `get` with any arguments (a blob, a string:
they are ignored) to half the reply's size (a stream's state: about 1,000 bytes and its prompts).
The replies to one source address draw on a token bucket of REPLY_BURST bytes refilled at
REPLY_RATE bytes a second; a reply the bucket cannot pay is dropped. `--osc-feedback` goes to the
target the operator named, uncapped.

The server binds to 127.0.0.1 unless `--osc-host` says otherwise: OSC has no login, so anyone who
can reach the port and knows a stream's id can steer it. Packets are parsed here (OSC 1.0: type
tags i f s b h d T F N, bundles nested at most MAX_BUNDLE_DEPTH deep, strings UTF-8); a malformed
packet is dropped whole, a bad message alone. Either is logged in one line, never a traceback, and
the lines are throttled (`LogThrottle`): one per source address per LOG_INTERVAL seconds (the next
says how many were not logged) and LOG_BURST per LOG_INTERVAL from every address together.
Nothing a packet carries stops the server.
"""

from __future__ import annotations

import logging
import math
import socket
import socketserver
import struct
import sys
import threading
import time
from collections import OrderedDict
from typing import Any

from pythonosc.osc_message_builder import OscMessageBuilder

from streamstudio.app.settings import CONTROL_SCALES, IP_ADAPTER_SCALE
from streamstudio.app.web import perform_routes
from streamstudio.app.web.sessions import SessionManager
from streamstudio.app.web.webrtc import WEBRTC_ID
from streamstudio.errors import StreamStudioError
from streamstudio.pipelines.live_settings import live_settings

log = logging.getLogger(__name__)

PREFIX = "streamstudio"
ALIASES = {"guidance": "guidance_scale", "negative": "negative_prompt", "filter": "similarity_filter",
           "threshold": "similarity_threshold", "cfg": "cfg_type"}
MAX_LOGGED = 120  # characters of a bad message (and of its error) shown in the log
FEEDBACK_INTERVAL = 0.5  # seconds between two state sends to --osc-feedback
REPLY_FACTOR = 2  # the datagrams answering one packet: at most this times its size, together
REPLY_BURST = 32_768  # bytes a source address may be sent at once (its token bucket's size)
REPLY_RATE = 16_384  # bytes a second its bucket refills
LOG_INTERVAL = 10.0  # seconds: one log line per source address in this time
LOG_BURST = 20  # log lines per LOG_INTERVAL from every source address together
MAX_SOURCES = 1024  # source addresses remembered (buckets, log throttle); the least recent forgotten
MAX_BUNDLE_DEPTH = 8  # bundles in bundles, at most
MAX_DATAGRAM = 65_536  # UDP's largest (socketserver reads 8192 bytes by default and cut longer packets)
BUNDLE = b"#bundle\0"


class MalformedPacket(StreamStudioError):
    """A datagram that is not OSC 1.0: dropped whole, logged in one line."""


# ---------------------------------------------------------------------- parsing (OSC 1.0)
def parse_packet(data: bytes, depth: int = 0) -> list[tuple[str, tuple]]:
    """(address, arguments) of every message in one datagram, bundles taken apart in order (their
    time tags are not waited for: a live control's change is wanted now); MalformedPacket saying
    what is wrong with it otherwise."""
    if data.startswith(BUNDLE):
        return _bundle(data, depth)
    if data.startswith(b"/"):
        return [_message(data)]
    raise MalformedPacket("neither a message (/...) nor a bundle (#bundle)")


def _bundle(data: bytes, depth: int) -> list[tuple[str, tuple]]:
    """A bundle: "#bundle", a 64-bit time tag, then elements, each an int32 size and a message
    or a bundle of that size."""
    if depth >= MAX_BUNDLE_DEPTH:
        raise MalformedPacket(f"bundles nested deeper than {MAX_BUNDLE_DEPTH}")
    if len(data) < 16:
        raise MalformedPacket("truncated: a bundle shorter than its time tag")
    messages, at = [], 16
    while at < len(data):
        size = _int32(data, at)
        at += 4
        if size <= 0 or size % 4 or at + size > len(data):
            raise MalformedPacket(f"a bundle element of {size} bytes where {len(data) - at} are left")
        messages += parse_packet(data[at:at + size], depth + 1)
        at += size
    return messages


def _message(data: bytes) -> tuple[str, tuple]:
    address, at = _string(data, 0)
    if at == len(data):  # no type tags (OSC before 1.0): no arguments
        return address, ()
    tags, at = _string(data, at)
    if not tags.startswith(","):
        raise MalformedPacket("the type tags must start with ','")
    args = []
    for tag in tags[1:]:
        value, at = _argument(data, at, tag)
        args.append(value)
    if at != len(data):
        raise MalformedPacket(f"{len(data) - at} bytes after the last argument")
    return address, tuple(args)


_FIXED = {"i": (">i", 4), "f": (">f", 4), "h": (">q", 8), "d": (">d", 8)}
_EMPTY = {"T": True, "F": False, "N": None}


def _argument(data: bytes, at: int, tag: str) -> tuple[Any, int]:
    if tag in _FIXED:
        fmt, size = _FIXED[tag]
        if at + size > len(data):
            raise MalformedPacket(f"truncated: no bytes for its '{tag}' argument")
        return struct.unpack_from(fmt, data, at)[0], at + size
    if tag == "s":
        return _string(data, at)
    if tag == "b":
        size = _int32(data, at)
        end = at + 4 + size
        if size < 0 or end + (-size % 4) > len(data):
            raise MalformedPacket(f"truncated: a blob of {size} bytes")
        return bytes(data[at + 4:end]), end + (-size % 4)
    if tag in _EMPTY:
        return _EMPTY[tag], at
    raise MalformedPacket(f"type tag {tag!r} not taken (i f s b h d T F N)")


def _int32(data: bytes, at: int) -> int:
    if at + 4 > len(data):
        raise MalformedPacket("truncated: no bytes for a size")
    return struct.unpack_from(">i", data, at)[0]


def _string(data: bytes, at: int) -> tuple[str, int]:
    """A string: UTF-8 bytes, a zero byte, zeros up to a multiple of 4 bytes."""
    end = data.find(b"\0", at)
    after = at + (end - at) // 4 * 4 + 4
    if end < 0 or after > len(data):
        raise MalformedPacket("truncated: a string without its zero bytes")
    try:
        return data[at:end].decode("utf-8"), after
    except UnicodeDecodeError:
        raise MalformedPacket("a string that is not UTF-8") from None


def encode(address: str, args: list) -> bytes:
    """One OSC message's datagram (python-osc's builder: i or h for whole numbers, f, s, T/F)."""
    builder = OscMessageBuilder(address)
    for arg in args:
        builder.add_arg(arg)
    return builder.build().dgram


# ---------------------------------------------------------------------- settings from messages
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
    out: list[tuple[str, list]] = [(f"{base}/fps", [float(stats["fps"])]),
                                   (f"{base}/processed", [int(stats["processed"])])]
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


def live_values(session) -> dict:
    """Every live setting of `session` by its API name: what was set on it (`stats()["settings"]`)
    over what the server starts every stream with (its model's config and prompts, the table's
    default for the session's own settings such as `fit`), and the add-ons' scales."""
    model, stats = session.model, session.stats()
    config = getattr(model, "config", None)
    values = {}
    for setting in live_settings():
        source = model if setting.name in ("prompt", "negative_prompt") else config
        values[setting.name] = getattr(source, setting.name, setting.default)
    comps = getattr(model, "comps", None)
    nets = list(getattr(comps, "controlnets", None) or [])
    if nets:
        defaults = getattr(comps, "control_defaults", None) or [("canny", 1.0)] * len(nets)
        values[CONTROL_SCALES] = [float(scale) for _, scale in defaults]
    if stats.get("ip_adapter"):
        values[IP_ADAPTER_SCALE] = stats["ip_adapter"]["scale"]
    values.update(stats.get("settings") or {})
    return values


# ---------------------------------------------------------------------- per source address
class ReplyBuckets:
    """A token bucket of bytes per source address: `take(source, n)` is whether `n` bytes may be
    sent there now (then they are taken). `burst` bytes at most, `rate` a second refilled; the
    `MAX_SOURCES` most recent addresses are remembered (a forgotten one starts full)."""

    def __init__(self, burst: int = REPLY_BURST, rate: float = REPLY_RATE, clock=time.monotonic):
        self.burst, self.rate, self.clock = burst, rate, clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # source -> (tokens, when)
        self._lock = threading.Lock()

    def take(self, source: str, n: int) -> bool:
        now = self.clock()
        with self._lock:
            tokens, then = self._buckets.pop(source, (self.burst, now))
            tokens = min(self.burst, tokens + (now - then) * self.rate)
            paid = tokens >= n
            self._buckets[source] = (tokens - n if paid else tokens, now)
            while len(self._buckets) > MAX_SOURCES:
                self._buckets.popitem(last=False)
        return paid


class LogThrottle:
    """At most one log line per source address per `interval` seconds and `burst` lines per
    `interval` from every address together. `allow(source)`: None when this line is held back
    (counted), else how many of that address's lines were held back since its last one."""

    def __init__(self, interval: float = LOG_INTERVAL, burst: int = LOG_BURST, clock=time.monotonic):
        self.interval, self.burst, self.clock = interval, burst, clock
        self.held = 0  # lines held back in all
        self._sources: OrderedDict[str, tuple[float, int]] = OrderedDict()  # source -> (last line, held since)
        self._window, self._written = -math.inf, 0
        self._lock = threading.Lock()

    def allow(self, source: str) -> int | None:
        now = self.clock()
        with self._lock:
            last, held = self._sources.pop(source, (-math.inf, 0))
            if now - last < self.interval or not self._room(now):
                self._sources[source] = (last, held + 1)
                self.held += 1
                result = None
            else:
                self._sources[source] = (now, 0)
                result = held
            while len(self._sources) > MAX_SOURCES:
                self._sources.popitem(last=False)
        return result

    def _room(self, now: float) -> bool:  # (under self._lock) the lines every address shares
        if now - self._window >= self.interval:
            self._window, self._written = now, 0
        self._written += 1
        return self._written <= self.burst


def _one_line(text: Any) -> str:
    """`text` cut to MAX_LOGGED characters with line breaks and control characters escaped."""
    return repr(str(text)[:MAX_LOGGED])[1:-1]


# ---------------------------------------------------------------------- the server
class OscControl:
    """The OSC server in a daemon thread: `OscControl(manager, port, host).close()`;
    `feedback` (host, port): where every running stream's state goes every FEEDBACK_INTERVAL s.
    Counters: `received` (messages), `applied`, `refused`, `malformed` (packets), `sent`."""

    def __init__(self, manager: SessionManager, port: int, host: str = "127.0.0.1",
                 feedback: tuple[str, int] | None = None, outputs=None):
        try:
            import pythonosc  # noqa: F401 - replies and feedback are built with it
        except ImportError:
            raise StreamStudioError("OSC control needs python-osc: pip install python-osc") from None
        if not 0 <= port <= 65535:
            raise StreamStudioError("--osc-port must be 0 to 65535")
        self.manager, self.feedback = manager, feedback
        self.outputs = outputs  # app.web.outputs.Outputs: /streamstudio/{stream}/output and /output_stop
        self.received = self.applied = self.refused = self.malformed = self.sent = 0
        self.buckets, self.throttle = ReplyBuckets(), LogThrottle()
        try:
            self._server = _UDPServer((host, port), self)
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

    def warn(self, sender: tuple, text: str) -> None:
        """One warning about what `sender` sent, throttled per source address (`LogThrottle`)."""
        held = self.throttle.allow(sender[0])
        if held is not None:
            more = f" ({held} more from this address not logged)" if held else ""
            log.warning("OSC from %s: %s%s", sender[0], text, more)

    def packet(self, data: bytes, sender: tuple) -> None:
        """One datagram from `sender`: its messages handled in order, then their replies sent
        together under the packet's cap (REPLY_FACTOR x its size) and the sender's bucket."""
        try:
            messages = parse_packet(data)
        except MalformedPacket as exc:
            self.malformed += 1
            self.warn(sender, f"a malformed packet of {len(data)} bytes dropped: {exc}")
            return
        replies = []
        for address, args in messages:
            replies += self.handle(sender, address, args)
        if replies:
            self._reply(sender, replies, REPLY_FACTOR * len(data))

    def handle(self, sender: tuple, address: str, args: tuple) -> list[tuple[str, list]]:
        """One message: a query's reply messages returned, or settings applied through the
        settings checks (nothing returned); a bad message is logged (throttled) and dropped."""
        self.received += 1
        try:
            if address.rstrip("/").endswith("/get"):
                return self._answer(address)
            if address.rstrip("/").endswith(("/output", "/output_stop")):
                self._output(address, args)
                self.applied += 1
                return []
            if perform_routes.osc_message(self.manager, address, args):  # tempo, tap, MIDI, modulations
                self.applied += 1
                return []
            current = None
            if address.rstrip("/").endswith("/blend"):
                session = self.manager.get(address.strip("/").split("/")[1]) if address.count("/") >= 2 else None
                current = session.stats()["settings"].get("prompt") if session is not None else None
            stream, raw = settings_from_message(address, args, current)
            self.manager.settings(stream, raw)
            self.applied += 1
        except Exception as exc:  # noqa: BLE001 - nothing a datagram carries stops the server
            self.refused += 1
            why = exc if isinstance(exc, StreamStudioError) else f"{type(exc).__name__}: {exc}"
            self.warn(sender, f"{_one_line(address)} {_one_line(args)} refused: {_one_line(why)}")
        return []

    def _output(self, address: str, args: tuple) -> None:
        """`/streamstudio/{stream}/output KIND TARGET [FPS]` starts an output of the stream (as `POST
        /studio/outputs/{stream}`); `/streamstudio/{stream}/output_stop [ID]` stops that output, or
        every output of the stream."""
        parts = address.strip("/").split("/")
        if self.outputs is None or len(parts) != 3 or parts[0] != PREFIX or not WEBRTC_ID.fullmatch(parts[1]):
            raise StreamStudioError(f"address must be /{PREFIX}/<stream>/output or /output_stop")
        stream = parts[1]
        if parts[2] == "output_stop":
            ids = [str(a) for a in args] or [o.oid for o in self.outputs.of(stream)]
            for oid in ids:
                self.outputs.stop(oid, stream)
            return
        if not 2 <= len(args) <= 3 or not all(isinstance(a, str) for a in args[:2]):
            raise StreamStudioError("/output takes KIND TARGET [FPS]: rtmp|hls|file|ndi, a URL or name, a number")
        fps = _number(args[2]) if len(args) == 3 else 30.0
        out = self.outputs.start(stream, args[0], args[1], fps)
        log.info("OSC started output %s of stream %s: %s", out.oid, stream, out.location)

    # ------------------------------------------------------------------ replies and feedback
    def _reply(self, sender: tuple, messages: list[tuple[str, list]], cap: int) -> None:
        dgrams = [encode(address, args) for address, args in messages]
        size = sum(map(len, dgrams))
        if size > cap:
            dgrams = [encode(f"/{PREFIX}/error", [f"pad to {-(-size // REPLY_FACTOR)} bytes"])]
            if len(dgrams[0]) > cap:
                return self.warn(sender, f"a reply of {size} bytes to a packet of {cap // REPLY_FACTOR} refused")
        if not self.buckets.take(sender[0], sum(map(len, dgrams))):
            return self.warn(sender, f"a reply dropped: over {REPLY_RATE} bytes a second to this address")
        for dgram in dgrams:
            self._sendto(dgram, sender)

    def _sendto(self, dgram: bytes, target: tuple) -> None:
        try:
            self._server.socket.sendto(dgram, target[:2])
            self.sent += 1
        except OSError as exc:  # an unreachable target: said, not raised into the server
            log.debug("OSC to %s: %s", target, exc)

    def send(self, target: tuple, address: str, args: list) -> None:
        """One OSC message to `target` (host, port), from the OSC port (a reply comes back from
        where the control surface sent to)."""
        self._sendto(encode(address, args), target)

    def stream_state(self, name: str) -> list[tuple[str, list]]:
        """The state messages of the stream `name` (its id or its watch id), under its public name."""
        session = self.manager.watched(name)
        if session is None or session.closed:
            return [(f"/{PREFIX}/error", ["no such stream"])]
        stats = session.stats()
        stats["settings"] = live_values(session)
        return state_messages(session.public_name, stats)

    def _answer(self, address: str) -> list[tuple[str, list]]:
        parts = address.strip("/").split("/")
        if parts == [PREFIX, "get"]:
            sessions = [self.manager.get(sid) for sid in self.manager.ids()]
            return [(f"/{PREFIX}/streams", [s.public_name for s in sessions if s is not None])]
        if len(parts) != 3 or parts[0] != PREFIX or not WEBRTC_ID.fullmatch(parts[1]):
            raise StreamStudioError(f"a query is /{PREFIX}/get or /{PREFIX}/<stream>/get")
        return self.stream_state(parts[1])

    def _feed(self) -> None:
        target = self.feedback
        assert target is not None  # (this thread runs with --osc-feedback only)
        while not self._stop.wait(FEEDBACK_INTERVAL):
            for stream in self.manager.ids():
                try:
                    for message in self.stream_state(stream):
                        self.send(target, *message)
                except Exception:
                    log.debug("OSC feedback for %s", stream, exc_info=True)

    def close(self) -> None:
        self._stop.set()
        if self._feeder is not None:
            self._feeder.join(5)
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


class _UDPServer(socketserver.UDPServer):
    """Every datagram to `control.packet`, whatever it holds (python-osc's server dropped those
    not starting with "/" or "#bundle" unlogged, and printed a traceback for each it failed on)."""

    max_packet_size = MAX_DATAGRAM

    def __init__(self, address: tuple[str, int], control: OscControl):
        self.control = control
        try:
            self.address_family = socket.getaddrinfo(address[0], address[1], type=socket.SOCK_DGRAM)[0][0]
        except (socket.gaierror, IndexError):
            pass  # the bind below says what is wrong
        super().__init__(address, _Handler)

    def handle_error(self, request, client_address) -> None:  # one throttled line, no traceback
        exc = sys.exc_info()[1]
        self.control.warn(client_address, f"a packet dropped: {type(exc).__name__}: {_one_line(exc)}")


class _Handler(socketserver.BaseRequestHandler):
    server: _UDPServer

    def handle(self) -> None:
        self.server.control.packet(self.request[0], self.client_address)
