"""OSC control: datagrams built here from the OSC 1.0 spec change a running stream's prompt,
strength, guidance, seed and blend through the API's settings checks; bad messages are logged
in one line and dropped, and the server goes on."""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time

import numpy as np
import pytest
import torch

pytest.importorskip("pythonosc")

SIZE = 64


def osc_string(text: str) -> bytes:
    raw = text.encode() + b"\0"
    return raw + b"\0" * (-len(raw) % 4)


def osc_message(address: str, *args) -> bytes:
    """An OSC 1.0 message: padded address, type tags, big-endian int32 / float32 / strings."""
    tags, body = ",", b""
    for arg in args:
        if isinstance(arg, bool):
            tags += "T" if arg else "F"
        elif isinstance(arg, int):
            tags, body = tags + "i", body + struct.pack(">i", arg)
        elif isinstance(arg, float):
            tags, body = tags + "f", body + struct.pack(">f", arg)
        else:
            tags, body = tags + "s", body + osc_string(arg)
    return osc_string(address) + osc_string(tags) + body


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    from streamstudio.app.cli import build_parser
    from streamstudio.app.cli.serve import start_in_thread

    torch.set_num_threads(1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    osc_port = free_udp_port()
    args = build_parser().parse_args(["serve", "--model", "tiny", "--width", str(SIZE), "--height", str(SIZE),
                                      "--port", str(port), "--osc-port", str(osc_port)])
    srv = start_in_thread(args)
    srv.osc_port = osc_port
    yield srv
    srv.close()


class Feeder:
    """Frames into a stream's session, as a WebRTC or WHIP source would hand them in."""

    def __init__(self, session):
        self.session, self._stop = session, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        i = 0
        while not self._stop.wait(0.05):
            self.session.submit(np.full((SIZE, SIZE, 3), i % 255, np.uint8))
            i += 1

    def stop(self):
        self._stop.set()
        self._thread.join(5)


def send(port: int, *datagrams: bytes) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for d in datagrams:
            s.sendto(d, ("127.0.0.1", port))


def wait_until(predicate, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_osc_changes_a_running_stream(server, caplog):
    session = server.manager.open("osc1")
    feeder = Feeder(session)
    try:
        wait_until(lambda: session.processed >= 2)
        applied = lambda: session.stats()["settings"]  # noqa: E731
        send(server.osc_port, osc_message("/streamstudio/osc1/prompt", "a glass sculpture"),
             osc_message("/streamstudio/osc1/strength", 0.7), osc_message("/streamstudio/osc1/guidance", 1.5),
             osc_message("/streamstudio/osc1/seed", 42))
        wait_until(lambda: applied().get("prompt") == "a glass sculpture" and applied().get("seed") == 42)
        assert applied()["strength"] == 0.7  # float32 0.699999988 taken as the 0.7 that was meant
        assert applied()["guidance_scale"] == 1.5

        send(server.osc_port, osc_message("/streamstudio/osc1/blend", "a cat", 0.25, "a dog", 0.75))
        wait_until(lambda: applied().get("prompt") == [["a cat", 0.25], ["a dog", 0.75]])
        send(server.osc_port, osc_message("/streamstudio/osc1/blend", 1.0, 0.0))  # weights alone
        wait_until(lambda: applied().get("prompt") == [["a cat", 1.0], ["a dog", 0.0]])

        # bad messages: one log line each, nothing applied, the server goes on
        with caplog.at_level(logging.WARNING, logger="streamstudio.app.web.osc"):
            send(server.osc_port, osc_message("/streamstudio/osc1/strength", 7.0),
                 osc_message("/streamstudio/osc1/strength", "lots"),
                 osc_message("/streamstudio/osc1/colour", 1),
                 osc_message("/other/osc1/prompt", "x"),
                 osc_message("/streamstudio/bad name/prompt", "x"),
                 osc_message("/streamstudio/osc1/prompt", "x" * 2000),
                 b"\xff\x00garbage that is not OSC",
                 osc_message("/streamstudio/osc1/strength", 0.4))
            wait_until(lambda: applied().get("strength") == 0.4)
        refused = [r for r in caplog.records if "refused" in r.getMessage()]
        assert len(refused) == 6 and all("\n" not in r.getMessage() for r in refused)
        assert any("strength must be in" in r.getMessage() for r in refused)
        assert session.error is None and not session.closed
    finally:
        feeder.stop()
        server.manager.close("osc1")


def test_osc_settings_for_a_stream_before_it_starts(server):
    send(server.osc_port, osc_message("/streamstudio/later/prompt", "a paper boat"))
    control = server.app.state.osc
    wait_until(lambda: control.applied >= 1 and "later" in server.manager._presets)
    session = server.manager.open("later")
    feeder = Feeder(session)
    try:
        wait_until(lambda: session.stats()["settings"].get("prompt") == "a paper boat")
    finally:
        feeder.stop()
        server.manager.close("later")


def osc_bundle(unix_time: float, *elements: bytes) -> bytes:
    """An OSC 1.0 bundle: "#bundle", a 64-bit NTP time tag (seconds since 1900, 32.32 fixed
    point), then each element with its int32 size."""
    ntp = unix_time + 2_208_988_800  # 1900-01-01 to 1970-01-01
    tag = struct.pack(">II", int(ntp), int((ntp % 1) * 2**32))
    return osc_string("#bundle") + tag + b"".join(struct.pack(">i", len(e)) + e for e in elements)


def test_a_bundle_tagged_for_later_does_not_stop_osc_control(server):
    """A bundle time-tagged an hour ahead stalled python-osc's dispatcher (it sleeps until the
    tag in the server's one thread): the messages after it were never applied. Every message is
    applied when it arrives."""
    control = server.app.state.osc
    before = control.applied
    send(server.osc_port,
         osc_bundle(time.time() + 3600, osc_message("/streamstudio/bundled/strength", 0.77)),
         osc_bundle(time.time() - 3600, osc_message("/streamstudio/bundled/guidance", 1.25),
                    osc_bundle(time.time() + 10**8, osc_message("/streamstudio/bundled/delta", 0.5))),
         osc_message("/streamstudio/bundled/seed", 7))
    wait_until(lambda: control.applied >= before + 4, timeout=5.0)
    preset = server.manager._presets["bundled"][0]
    assert preset == {"strength": pytest.approx(0.77), "guidance_scale": 1.25, "delta": 0.5, "seed": 7}


def test_python_osc_client_and_loopback_bind(server):
    from pythonosc.udp_client import SimpleUDPClient

    assert server.app.state.osc.address[0] == "127.0.0.1"
    session = server.manager.open("osc2")
    feeder = Feeder(session)
    try:
        SimpleUDPClient("127.0.0.1", server.osc_port).send_message("/streamstudio/osc2/strength", 0.35)
        wait_until(lambda: session.stats()["settings"].get("strength") == 0.35)
    finally:
        feeder.stop()
        server.manager.close("osc2")


def test_message_mapping():
    from streamstudio.app.web.osc import settings_from_message
    from streamstudio.errors import StreamStudioError

    assert settings_from_message("/streamstudio/s/seed", (7.0,)) == ("s", {"seed": 7})
    assert settings_from_message("/streamstudio/s/negative_prompt", ("blur",)) == ("s", {"negative_prompt": "blur"})
    assert settings_from_message("/streamstudio/s/filter", (1,)) == ("s", {"similarity_filter": True})
    with pytest.raises(StreamStudioError, match="alone needs a current blend"):
        settings_from_message("/streamstudio/s/blend", (0.5, 0.5), current_prompt="one prompt")
    with pytest.raises(StreamStudioError, match="one value"):
        settings_from_message("/streamstudio/s/strength", (0.5, 0.5))


def test_add_on_scales_by_osc():
    """ControlNet scales (one value per net) and the IP-Adapter scale, through the API's checks."""
    from streamstudio.app.web.osc import settings_from_message
    from streamstudio.app.settings import parse_settings
    from streamstudio.errors import StreamStudioError

    stream, raw = settings_from_message("/streamstudio/s/control_scales", (0.800000011920929, 0.5))
    assert stream == "s" and parse_settings(raw) == {"control_scales": [0.8, 0.5]}
    assert parse_settings(settings_from_message("/streamstudio/s/ip_adapter_scale", (0.6,))[1]) == \
        {"ip_adapter_scale": 0.6}
    with pytest.raises(StreamStudioError, match="one value"):
        settings_from_message("/streamstudio/s/ip_adapter_scale", (0.6, 0.7))
    with pytest.raises(StreamStudioError, match="control_scales is a list"):
        parse_settings(settings_from_message("/streamstudio/s/control_scales", ())[1])


# ---------------------------------------------------------------------- feedback (issue 29)
def parse_osc(datagram: bytes) -> tuple[str, list]:
    """An OSC 1.0 message read back by the spec (not python-osc): a padded address, a padded
    type-tag string, then int32 / float32 big-endian and padded strings; T and F carry no bytes."""
    def string(at: int) -> tuple[str, int]:
        end = datagram.index(b"\0", at)
        return datagram[at:end].decode(), at + (end - at) // 4 * 4 + 4

    address, at = string(0)
    tags, at = string(at)
    assert tags.startswith(",")
    args = []
    for tag in tags[1:]:
        if tag == "i":
            args.append(struct.unpack(">i", datagram[at:at + 4])[0])
            at += 4
        elif tag == "f":
            args.append(struct.unpack(">f", datagram[at:at + 4])[0])
            at += 4
        elif tag == "s":
            text, at = string(at)
            args.append(text)
        elif tag in "TF":
            args.append(tag == "T")
        else:
            raise AssertionError(f"unexpected OSC type tag {tag!r}")
    return address, args


def listen() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(5.0)
    return sock


def received(sock: socket.socket, until: str, limit: int = 200) -> dict[str, list]:
    """address -> arguments of the messages read until one at `until` arrives."""
    got = {}
    for _ in range(limit):
        data, _ = sock.recvfrom(65536)
        address, args = parse_osc(data)
        got[address] = args
        if address == until:
            return got
    raise AssertionError(f"no {until} in {limit} messages: {sorted(got)}")


def test_get_is_answered_to_the_sender_with_the_streams_state(server):
    """A control surface asks /streamstudio/STREAM/get and gets the stream's state back at the port
    it sent from, from the OSC port: fps, frames, latency, the prompt and every applied setting."""
    session = server.manager.open("oscget")
    feeder = Feeder(session)
    sock = listen()
    try:
        wait_until(lambda: session.processed >= 3)
        send(server.osc_port, osc_message("/streamstudio/oscget/prompt", "a paper boat"),
             osc_message("/streamstudio/oscget/strength", 0.55), osc_message("/streamstudio/oscget/seed", 9))
        wait_until(lambda: session.stats()["settings"].get("seed") == 9)
        sock.sendto(osc_message("/streamstudio/oscget/get"), ("127.0.0.1", server.osc_port))
        got = received(sock, "/streamstudio/oscget/strength")  # the settings come in name order
        assert got["/streamstudio/oscget/prompt"] == ["a paper boat"]
        assert got["/streamstudio/oscget/strength"] == [pytest.approx(0.55, abs=1e-6)]
        assert got["/streamstudio/oscget/fps"][0] > 0 and got["/streamstudio/oscget/processed"][0] >= 3
        assert got["/streamstudio/oscget/latency_ms"][0] > 0
        sock.sendto(osc_message("/streamstudio/oscget/get"), ("127.0.0.1", server.osc_port))
        assert received(sock, "/streamstudio/oscget/seed")["/streamstudio/oscget/seed"] == [9]
        sock.sendto(osc_message("/streamstudio/get"), ("127.0.0.1", server.osc_port))
        assert "oscget" in received(sock, "/streamstudio/streams")["/streamstudio/streams"]
        sock.sendto(osc_message("/streamstudio/nobody/get"), ("127.0.0.1", server.osc_port))
        assert "no running stream" in received(sock, "/streamstudio/nobody/error")["/streamstudio/nobody/error"][0]
    finally:
        sock.close()
        feeder.stop()
        server.manager.close("oscget")


def test_feedback_sends_every_streams_state_to_the_target(server):
    """--osc-feedback HOST:PORT: twice a second, each running stream's state goes to the target
    without being asked (a blend as /blend "prompt" weight ...)."""
    from streamstudio.app.web.osc import FEEDBACK_INTERVAL, OscControl

    sock = listen()
    osc = OscControl(server.manager, 0, feedback=sock.getsockname())
    session = server.manager.open("oscfeed")
    feeder = Feeder(session)
    try:
        server.manager.settings("oscfeed", {"prompt": [["a fox", 0.25], ["a wolf", 0.75]]})
        wait_until(lambda: session.processed >= 2 and session.stats()["settings"].get("prompt") is not None)
        t0 = time.monotonic()
        got = {}
        while "/streamstudio/oscfeed/blend" not in got or "/streamstudio/oscfeed/fps" not in got:
            got.update(received(sock, "/streamstudio/oscfeed/processed"))
            assert time.monotonic() - t0 < 10 * FEEDBACK_INTERVAL + 5, sorted(got)
        blend = got["/streamstudio/oscfeed/blend"]
        assert blend[0::2] == ["a fox", "a wolf"] and blend[1::2] == [pytest.approx(0.25), pytest.approx(0.75)]
        assert got["/streamstudio/oscfeed/fps"][0] >= 0 and osc.sent > 0
    finally:
        osc.close()
        sock.close()
        feeder.stop()
        server.manager.close("oscfeed")


def test_osc_feedback_flag_is_checked_before_anything_loads(capsys):
    from streamstudio.app.cli import main

    assert main(["serve", "--model", "tiny", "--osc-feedback", "127.0.0.1:9000"]) == 1
    assert "--osc-feedback sends from the OSC port: give --osc-port too" in capsys.readouterr().err
    for bad in ("9000", "host:0", "host:port", ":9000"):
        assert main(["serve", "--osc-port", "9001", "--osc-feedback", bad]) == 2  # a usage error
        assert "argument --osc-feedback" in capsys.readouterr().err
