"""`streamstudio serve`: the web app (Gradio UI + WebRTC endpoint) on one server.

Binds to 127.0.0.1:7860 unless --host is given. Settings from the environment:
STREAMSTUDIO_AUTH (USER:PASS, as --auth), STREAMSTUDIO_TURN_URLS, STREAMSTUDIO_TURN_USERNAME,
STREAMSTUDIO_TURN_CREDENTIAL and STREAMSTUDIO_STUN_URLS (ICE servers for use across networks),
STREAMSTUDIO_WHIP_TOKEN (as --whip-token), STREAMSTUDIO_WHEP_TOKEN (as --whep-token).
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import os
import socket
import sys
from pathlib import Path

from streamstudio.app.settings import add_pipeline_arguments, host_port, number
from streamstudio.errors import StreamStudioError
from streamstudio.models.hub import check_model_source

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("serve", description=__doc__.splitlines()[0])
    p.add_argument("--host", default=None, help="address to bind (default 127.0.0.1; anything else "
                                                "exposes the app to the network: use --auth)")
    p.add_argument("--port", type=number(int, 1, 65535), default=7860, help="port (default 7860)")
    p.add_argument("--auth", default=None, metavar="USER:PASS",
                   help="require this login (default: $STREAMSTUDIO_AUTH when set)")
    p.add_argument("--video-model", default=None, metavar="MODEL",
                   help="one more model for the Video tab beside the built-in ones: a StreamDiT checkpoint folder, a "
                        "Wan 2.1 folder or hub id, a causal checkpoint folder or a Self-Forcing / CausVid / "
                        "StreamDiffusionV2 .pt file or hub id")
    p.add_argument("--live-pipeline", choices=("image", "video"), default="image",
                   help="what the live streams (the Live tab, WHIP publishers, /webrtc/offer) play from their first "
                        "frame: the image model (default) or --video-model (default the built-in StreamDiT; e.g. "
                        "builtin-causal) video-to-video; a deck switches either way later")
    p.add_argument("--max-streams", type=number(int, 1, 10_000), default=4,
                   help="concurrent live streams at most, every tab's together (default 4)")
    p.add_argument("--gpus", type=number(int, 1, 1024), default=1,
                   help="model replicas, one per GPU (cuda:0 .. N-1; with --device cpu, N CPU replicas), each with "
                        "its own batching and --max-streams streams; a new stream goes to the least-loaded one "
                        "(app/web/replicas.py)")
    p.add_argument("--cluster", default=None, metavar="auto|local|ray://HOST:10001|HOST:6379",
                   help="model replicas as Ray actors, one process each: one per GPU of the cluster (CPU nodes: "
                        "--node-replicas); this server stays the one front end and moves a failed replica's "
                        "streams to the others. local: a Ray on this machine; auto: $RAY_ADDRESS, else local "
                        "(docs/cluster.md)")
    p.add_argument("--node-replicas", type=number(int, 1, 64), default=1,
                   help="with --cluster, CPU replicas on each node without GPUs (default 1)")
    p.add_argument("--max-replicas", type=number(int, 1, 4096), default=None,
                   help="with --cluster, elastic replicas: at most this many, one more whenever every replica is full "
                        "(on a node with room, else asked of Ray's autoscaler); default: one per GPU of every node")
    p.add_argument("--min-replicas", type=number(int, 1, 4096), default=None,
                   help="with --max-replicas, the replicas kept running however idle (default 1)")
    p.add_argument("--replica-idle-release", type=number(float, 1, 86400), default=60.0,
                   help="with --max-replicas, stop a replica that held no stream this many seconds (default 60)")
    p.add_argument("--replica-transport", choices=("auto", "compiled", "calls"), default="auto",
                   help="with --cluster, how frames reach the replicas: compiled (Ray compiled graphs: under 1 ms a "
                        "512x512 frame, a CPU core kept busy per replica), calls (plain actor calls: ~7 ms more, no "
                        "core spent waiting); auto: compiled for GPU replicas, calls for CPU ones (docs/cluster.md)")
    p.add_argument("--idle-timeout", type=number(float, 0, 86400, low_open=True), default=20.0,
                   help="free a stream that sent no frame for this many seconds (default 20)")
    p.add_argument("--max-upload-size", default="20mb", help="largest upload accepted (default 20mb)")
    p.add_argument("--max-upload-total", default="200mb",
                   help="the uploads this server holds on disk, all clients together (default 200mb; "
                        "uploads are deleted after --upload-ttl)")
    p.add_argument("--uploads-per-client", type=number(int, 1, 10**6), default=20,
                   help="uploads one client may make in 10 minutes (default 20)")
    p.add_argument("--upload-ttl", type=number(float, 10, 86400 * 7), default=300.0,
                   help="seconds an upload or cached file is kept before it is deleted (default 300)")
    p.add_argument("--show", default=None, metavar="FILE",
                   help="a show file (JSON): the tempo and each stream's modulations, taken when the stream opens "
                        "(\"*\": any stream); GET /studio/show writes one (README, live performance)")
    p.add_argument("--midi-in", default=None, metavar="PORT",
                   help="a MIDI input on this machine (its name, or the start of it): control changes feed the "
                        "streams' MIDI modulations, its clock the tempo (needs pip install \"streamstudio[midi]\")")
    p.add_argument("--audio-latency-ms", type=number(float, 0, 5000), default=None, metavar="MS",
                   help="read every stream's audio features this late (0..5000 ms); default: each stream's measured "
                        "glass-to-glass latency (a stream's \"latency_ms\" in its modulations wins)")
    p.add_argument("--link", action="store_true",
                   help="join the Ableton Link session on this network: the tempo follows it, and a tempo set here "
                        "goes to it (needs pip install \"streamstudio[link]\")")
    p.add_argument("--latency-probe", action="store_true",
                   help="copy a frame counter drawn in the input's top band onto the output (benchmarks/webapp.py)")
    p.add_argument("--output-dir", default="outputs", help="folder for Live output recordings (default outputs)")
    p.add_argument("--allow-push", default=None, metavar="HOST[,HOST...]|any|none",
                   help="the RTMP hosts the Live output tab may push a stream to (default: any when the server "
                        "binds a loopback address, none otherwise: a page could make the server push anywhere)")
    p.add_argument("--no-stream-batching", action="store_true",
                   help="let live streams take turns on the model instead of batching their network calls together")
    p.add_argument("--max-batch-rows", type=number(int, 1, 1024), default=16,
                   help="cross-stream batching: UNet/VAE batch rows per call at most (default 16; TensorRT "
                        "engines are sized from it)")
    p.add_argument("--batch-wait-ms", type=number(float, 0, 1000), default=2.0,
                   help="cross-stream batching: how long a call waits for other streams' calls (default 2 ms)")
    p.add_argument("--whip-token", default=None, metavar="TOKEN",
                   help="bearer token WHIP publishers (OBS) must send, and every control route (/studio/*: "
                        "settings, sessions, outputs); WHEP viewers may send it too (default: "
                        "$STREAMSTUDIO_WHIP_TOKEN; without either, --auth's USER:PASS; without --auth, none)")
    p.add_argument("--whep-token", default=None, metavar="TOKEN",
                   help="a bearer token that lets WHEP players watch and do nothing else (default: "
                        "$STREAMSTUDIO_WHEP_TOKEN; without either, viewers need --whip-token or the --auth login, "
                        "so that nothing a viewer holds can publish or steer a stream)")
    p.add_argument("--whip-cors", action="append", default=[], metavar="ORIGIN",
                   help="a web page origin (https://studio.example.com, or * for any) whose pages may publish "
                        "(WHIP) and watch (WHEP) without a login; repeatable (default: none; with a token or "
                        "--auth, any origin may, the token being the credential)")
    p.add_argument("--max-viewers", type=number(int, 0, 10_000), default=32,
                   help="WHEP viewers on the server at most, all streams together (default 32)")
    p.add_argument("--max-viewers-per-source", type=number(int, 1, 10_000), default=8,
                   help="WHEP viewers one client address may hold at once (default 8)")
    p.add_argument("--max-pending-per-source", type=number(int, 1, 10_000), default=None,
                   help="connections one client address may hold before they stream (offered, not connected "
                        "or no frame yet; each holds a stream slot for up to 8 s) (default: half of --max-streams, "
                        "at least 1)")
    p.add_argument("--max-pending", type=number(int, 1, 10_000), default=None,
                   help="connections of every address together that may hold a stream slot before they stream; at "
                        "the cap a new connection ends the waiting one of the address that made the most "
                        "connections this minute (default: half of --max-streams, at least 1)")
    p.add_argument("--offers-per-minute", type=number(int, 1, 100_000), default=20,
                   help="new connections (WebRTC offers, WHIP and WHEP POSTs) one client address may make "
                        "per minute (default 20)")
    p.add_argument("--trusted-proxy", action="append", default=[], metavar="ADDR",
                   help="a reverse proxy (an address or a network, e.g. 127.0.0.1 or 10.0.0.0/8) whose "
                        "X-Forwarded-For / X-Forwarded-Proto headers are believed; repeatable (default: none: a "
                        "client is its peer address, whatever it sends)")
    p.add_argument("--osc-port", type=number(int, 1, 65535), default=None,
                   help="take OSC control messages on this UDP port (default: off)")
    p.add_argument("--input", default=None, metavar="SOURCE",
                   help="a live source the server streams itself (ndi://NAME, webcam:N, rtmp://..., srt://..., "
                        "pattern): a stream like a WHIP publisher's, named by --input-stream, for WHEP viewers, "
                        "the Live outputs and OSC; reopened when it stops (default: none)")
    p.add_argument("--input-stream", default="input", metavar="NAME",
                   help="the stream name --input feeds (default input)")
    p.add_argument("--output", action="append", default=[], metavar="URL",
                   help="with --input: an output of its stream, started as soon as it runs and again whenever it "
                        "restarts: rtmp://HOST/APP/KEY, ndi://NAME, NAME.m3u8 (HLS) or a file name (.mp4, .mkv, .webm, "
                        ".mov; under --output-dir); repeatable, up to 2 (the outputs a stream may have)")
    p.add_argument("--osc-feedback", type=host_port, default=None, metavar="HOST:PORT",
                   help="send every running stream's state (fps, latency, prompt, settings) to this OSC "
                        "target twice a second, from the --osc-port (default: off; queries are answered "
                        "without it)")
    p.add_argument("--osc-host", default="127.0.0.1",
                   help="address the OSC port binds (default 127.0.0.1; OSC has no login)")
    add_pipeline_arguments(p)
    return p


def parse_auth(value: str | None) -> tuple[str, str] | None:
    value = value if value is not None else os.environ.get("STREAMSTUDIO_AUTH")
    if not value:
        return None
    user, sep, password = value.partition(":")
    if not sep or not user or not password:
        raise StreamStudioError("--auth (or STREAMSTUDIO_AUTH) must be USER:PASS with both parts non-empty")
    return user, password


def bind_host(args) -> str:
    host = args.host or "127.0.0.1"
    if args.host and host not in LOOPBACK:
        print(f"warning: binding to {host}: the app is reachable from the network"
              + ("" if parse_auth(args.auth) else " WITHOUT a login; add --auth USER:PASS")
              + ". Put it behind HTTPS for webcam access from other machines.", file=sys.stderr)
    return host


def check_outputs(args) -> list[tuple[str, str]]:
    """`--output` URLs as (kind, target), checked before the model loads."""
    from streamstudio.app.web.outputs import parse_output_url  # (that module imports the web stack: not at --help)

    urls = list(getattr(args, "output", None) or ())
    if urls and not getattr(args, "input", None):
        raise StreamStudioError("--output sends the --input stream out: give --input too (other streams' outputs "
                                "start from the Live output tab or POST /studio/outputs/{stream})")
    if len(urls) > 2:
        raise StreamStudioError(f"--output given {len(urls)} times: a stream may have 2 outputs")
    return [parse_output_url(u) for u in urls]


def check_osc(args) -> None:
    if getattr(args, "osc_feedback", None) is not None and getattr(args, "osc_port", None) is None:
        raise StreamStudioError("--osc-feedback sends from the OSC port: give --osc-port too")


def proxy_options(args) -> dict:
    """uvicorn's proxy-header options: believed only from the --trusted-proxy addresses (uvicorn's
    own default believes X-Forwarded-For from 127.0.0.1, so any local client could name itself)."""
    trusted = list(getattr(args, "trusted_proxy", None) or ())
    for addr in trusted:
        try:
            ipaddress.ip_network(addr, strict=False)
        except ValueError:
            raise StreamStudioError(f"--trusted-proxy {addr!r} is not an address or a network "
                                    "(write it like 127.0.0.1, ::1 or 10.0.0.0/8)") from None
    return {"proxy_headers": bool(trusted), "forwarded_allow_ips": trusted or ""}


def check_port_free(host: str, port: int, kind: int = socket.SOCK_STREAM, flag: str = "--port") -> None:
    """The port can be bound on `host` now (TCP as uvicorn binds it, with SO_REUSEADDR; UDP for
    OSC): said before the model loads, with what to do, instead of a bind error after it."""
    try:
        infos = socket.getaddrinfo(host, port, type=kind)
    except socket.gaierror as exc:
        raise StreamStudioError(f"cannot serve on {host}: the address does not resolve ({exc.strerror}); "
                                "give --host an address of this machine, e.g. 127.0.0.1 or 0.0.0.0") from exc
    family, _, _, _, address = infos[0]
    with socket.socket(family, kind) as sock:
        if kind == socket.SOCK_STREAM:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise StreamStudioError(f"port {port} on {host} is in use (another StreamStudio, or another "
                                        f"program); stop it or pick another {flag}, e.g. {flag} {port + 1}") from exc
            raise StreamStudioError(f"cannot serve on {host}:{port} ({exc.strerror or exc}); give --host an "
                                    f"address of this machine and {flag} a port you may open (1024 and above "
                                    "without root)") from exc


def check(args) -> None:
    """What serve says before the model loads (and before the web app's packages are imported):
    the output folder, the host, --trusted-proxy, the ports free, --osc-*, --output, --midi-in, the model."""
    output_dir = Path(getattr(args, "output_dir", None) or "outputs")
    if output_dir.exists() and not output_dir.is_dir():
        raise StreamStudioError(f"--output-dir {output_dir} is a file; name a folder for the Live output recordings "
                                "(it is made when missing)")
    host = bind_host(args)
    proxy_options(args)
    check_port_free(host, args.port)
    check_osc(args)
    check_outputs(args)
    if getattr(args, "osc_port", None) is not None:
        check_port_free(args.osc_host, args.osc_port, socket.SOCK_DGRAM, "--osc-port")
    if getattr(args, "midi_in", None):
        from streamstudio.app.perform import midi_port  # (mido: only with --midi-in)

        midi_port.pick_input(args.midi_in, midi_port.input_names())
    check_model_source(args.model)
