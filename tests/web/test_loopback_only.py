"""Tests, benchmarks and CI send packets only to 127.0.0.0/8 and ::1 (issue 44, item 1).

Read from the source: every aiortc peer connection names its ICE servers (aiortc's default
configuration asks a public STUN server, stun.l.google.com), every browser page's too, every
Chromium started by a test or benchmark has mDNS candidates off (mDNS announces on the machine's
interfaces by multicast), and every local Ray that a test or benchmark starts listens on loopback.
Checked at run time: the server's peer connections carry no ICE server when none is configured,
and a local Ray's listeners are all on 127.0.0.1."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("tests", "benchmarks", "streamstudio")
MDNS_OFF = "--disable-features=WebRtcHideLocalIpsWithMdns"


def python_files():
    for top in SCANNED:
        yield from sorted((ROOT / top).rglob("*.py"))


def call_name(node: ast.Call) -> str:
    f = node.func
    if isinstance(f, ast.Attribute):
        base = f.value.id if isinstance(f.value, ast.Name) else ""
        return f"{base}.{f.attr}"
    return f.id if isinstance(f, ast.Name) else ""


def unconfigured_peers(tree: ast.AST) -> list[int]:
    """Lines of `RTCPeerConnection(...)` calls without a configuration (or with None)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and call_name(node).split(".")[-1] == "RTCPeerConnection":
            given = node.args[:1] + [k.value for k in node.keywords if k.arg == "configuration"]
            if not given or (isinstance(given[0], ast.Constant) and given[0].value is None):
                lines.append(node.lineno)
    return lines


def local_ray_without_loopback(tree: ast.AST) -> list[int]:
    """Lines of `ray.init(...)` that start a local Ray (no address) in a function that does not
    first call `loopback_only()` (app/ray_connect.py)."""
    lines = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call)]
        guarded = any(call_name(c).split(".")[-1] == "loopback_only" for c in calls)
        for c in calls:
            if call_name(c) == "ray.init" and not any(k.arg == "address" for k in c.keywords) and not c.args \
                    and not guarded:
                lines.append(c.lineno)
    return lines


def test_the_scan_finds_what_it_looks_for():
    """The checks below would catch the mistakes they are about (the bare call is written in two
    pieces, so that no scan of this file's text takes the example for the real thing)."""
    bare = "RTCPeerConnection(" + ")"
    bad = ast.parse("from aiortc import RTCPeerConnection\n"
                    f"def f():\n    return {bare}\n"
                    "def g():\n    return aiortc.RTCPeerConnection(configuration=None)\n"
                    "def h():\n    return RTCPeerConnection(RTCConfiguration(iceServers=[]))\n"
                    "def r():\n    ray.init(num_cpus=2)\n"
                    "def s():\n    loopback_only()\n    ray.init(num_cpus=2)\n"
                    "def t():\n    ray.init(address='127.0.0.1:6379')\n")
    assert unconfigured_peers(bad) == [3, 5]
    assert local_ray_without_loopback(bad) == [9]


def test_every_aiortc_peer_names_its_ice_servers():
    found = {f"{path.relative_to(ROOT)}:{line}" for path in python_files()
             for line in unconfigured_peers(ast.parse(path.read_text(), str(path)))}
    assert not found, ("RTCPeerConnection without RTCConfiguration(iceServers=[...]) (asks a public STUN server): "
                       f"{found}")


def test_every_browser_peer_names_its_ice_servers_and_chromium_has_mdns_off():
    js_peer = re.compile(r"new RTCPeerConnection\(([^)]*)\)")
    pages, launched = {}, []
    for path in python_files():
        text = path.read_text()
        for match in js_peer.finditer(text):
            pages[f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, match.start()) + 1}"] = match.group(1)
        if re.search(r"chromium\.launch|launch_persistent_context", text):
            launched.append(path)
    assert pages, "the scan found no browser page (the pattern is stale)"
    assert all("iceServers" in args for args in pages.values()), pages
    assert launched, "the scan found no Chromium launch (the pattern is stale)"
    missing = [str(p.relative_to(ROOT)) for p in launched if MDNS_OFF not in p.read_text()]
    assert not missing, f"Chromium started without {MDNS_OFF}: {missing}"


def test_every_local_ray_listens_on_loopback_in_the_source():
    found = {f"{path.relative_to(ROOT)}:{line}" for top in ("tests", "benchmarks")
             for path in sorted((ROOT / top).rglob("*.py"))
             for line in local_ray_without_loopback(ast.parse(path.read_text(), str(path)))}
    assert not found, f"a local ray.init() without app.ray_connect.loopback_only() (Ray listens on every " \
                      f"interface): {found}"


def test_server_peers_get_no_ice_server_without_a_configuration():
    """fastrtc turns rtc_configuration=None into aiortc's default, which asks Google's STUN server;
    the server's /webrtc/offer stream and WHIP/WHEP connections must name no server instead."""
    from streamstudio.app.web.webrtc import explicit_rtc_config
    from streamstudio.app.web.whip_sdp import rtc_configuration

    assert explicit_rtc_config(None) == {"iceServers": []}
    turn = {"iceServers": [{"urls": ["turn:127.0.0.1:3478"], "username": "u", "credential": "c"}]}
    assert explicit_rtc_config(turn) is turn
    assert rtc_configuration(None).iceServers == []


def test_the_offer_streams_peers_carry_an_empty_ice_server_list():
    pytest.importorskip("fastrtc")
    from streamstudio.app.web.sessions import SessionManager
    from streamstudio.app.web.webrtc import build_stream

    class Model:  # what build_stream reads of the manager's model: nothing before a frame
        name, is_demo, size = "none", False, (64, 64)

    manager = SessionManager(Model(), max_streams=1, owns_model=False)
    try:
        stream = build_stream(manager)
        assert stream.server_rtc_configuration is not None
        assert stream.server_rtc_configuration.iceServers == []
    finally:
        manager.shutdown()
