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
