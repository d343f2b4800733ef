"""Keep the server's WebRTC media sockets on the address its HTTP server binds.

aiortc has no option for which local addresses ICE uses: every peer connection asks
`aioice.ice.get_host_addresses()` and opens a UDP socket (and offers a host candidate) on every
interface but loopback. A server bound to 127.0.0.1 would still take media on every network
interface. This module narrows that, for the server's own peer connections only:

- `install()` replaces `aioice.ice.get_host_addresses` (the one name `Connection.gather_candidates`
  looks up) with a wrapper, once per process. Outside a scope the wrapper calls the original, so
  every other peer connection in the process (clients, tests, other libraries) is unchanged.
- `scoped(addresses)` sets a context variable for the code it wraps: connections that gather
  their candidates inside it (aiortc gathers in `setLocalDescription`, awaited while the offer is
  answered) get only those addresses. A context variable follows awaits and the tasks they start,
  and no other request, thread or event loop sees it.
- `IceScopeMiddleware` applies the scope to every request of one ASGI app, so the peer
  connections of all the app's WebRTC endpoints (the JSON `/webrtc/offer` and the Gradio WebRTC
  component's own offer route) are covered, and two servers in one process keep their own
  addresses.

Not covered: a TURN relay's socket (a connected socket that only hears the TURN server) and
aioice's mDNS resolver (a multicast socket on port 5353, opened only while a client's offer has
`.local` candidates to resolve).
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Callable, Iterator
from contextvars import ContextVar

from streamstudio.errors import StreamStudioError

ALL_INTERFACES = ("", "0.0.0.0", "::", "[::]")
LOOPBACK_NAMES = ("localhost",)

# None: aioice's own choice (every interface but loopback)
_addresses: ContextVar[tuple[str, ...] | None] = ContextVar("streamstudio_ice_addresses", default=None)
_original: Callable[..., list[str]] | None = None  # aioice's get_host_addresses, once `install` replaced it


def ice_addresses(host: str | None) -> tuple[str, ...] | None:
    """The local addresses ICE may use for a server bound to `host`: loopback for None (the
    server's default bind, 127.0.0.1), None (every interface) for 0.0.0.0 / ::, else the address
    itself (a name is resolved once, here)."""
    if host is None:
        return ("127.0.0.1",)
    host = host.strip()
    if host in ALL_INTERFACES:
        return None
    if host.lower() in LOOPBACK_NAMES:
        return ("127.0.0.1",)
    try:
        return (str(ipaddress.ip_address(host.strip("[]"))),)
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)
    except OSError as exc:
        raise StreamStudioError(f"cannot resolve the host {host!r} for WebRTC media: {exc}") from exc
    found = tuple(dict.fromkeys(str(ipaddress.ip_address(info[4][0])) for info in infos))
    if not found:
        raise StreamStudioError(f"the host {host!r} has no address for WebRTC media")
    return found


def _scoped_host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
    addresses = _addresses.get()
    if addresses is None:
        assert _original is not None  # (installed in its place by `install`)
        return _original(use_ipv4=use_ipv4, use_ipv6=use_ipv6)
    return [a for a in addresses if (use_ipv6 if ipaddress.ip_address(a).version == 6 else use_ipv4)]


def install() -> None:
    """Route aioice's host address lookup through the scope (idempotent)."""
    global _original
    import aioice.ice

    if _original is None:
        _original = aioice.ice.get_host_addresses
        aioice.ice.get_host_addresses = _scoped_host_addresses


@contextlib.contextmanager
def scoped(addresses: tuple[str, ...] | None) -> Iterator[None]:
    """Peer connections gathering candidates inside use only `addresses` (None: all)."""
    install()
    token = _addresses.set(addresses)
    try:
        yield
    finally:
        _addresses.reset(token)


def current() -> tuple[str, ...] | None:
    return _addresses.get()


class IceScopeMiddleware:
    """ASGI middleware: every request (and the tasks it starts) runs in `scoped(addresses)`."""

    def __init__(self, app, addresses: tuple[str, ...] | None):
        self.app, self.addresses = app, addresses
        install()

    async def __call__(self, scope, receive, send):
        token = _addresses.set(self.addresses)
        try:
            await self.app(scope, receive, send)
        finally:
            _addresses.reset(token)
