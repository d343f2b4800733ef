"""Ableton Link (issue 48): `serve --link` joins the Link session on the server's network (Ableton
Live, Bitwig, Traktor, Resolume, phones running Link apps), so the tempo clock the modulations read
follows the session's tempo and beat (the bar's phase: Link keeps the peers' beats equal modulo a
4-beat bar, not their counts), and a tempo set on the server (`PUT /studio/tempo`, a tap,
OSC) is sent to the session. Link finds its peers by multicast on the local network; aalink (the
`link` extra) runs it on an asyncio loop of its own thread here.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

from streamstudio.app.perform.tempo import TempoClock
from streamstudio.errors import StreamStudioError

log = logging.getLogger(__name__)

PERIOD_S = 0.02  # how often the clock is set from the session (a frame at 50 fps)
QUANTUM = 4.0  # beats a bar: Link aligns the peers' beat counts modulo this (phase of the bar)


def _aalink() -> Any:
    try:
        import aalink  # optional: the `link` extra
    except ImportError as exc:
        raise StreamStudioError('--link needs aalink: pip install "streamstudio[link]"') from exc
    return aalink


class LinkFollower:
    """The server's place in a Link session, until `close()`."""

    def __init__(self, clock: TempoClock, period_s: float = PERIOD_S):
        self.clock, self.period_s = clock, period_s
        self._aalink = _aalink()
        self.peers = 0
        self._pushed = clock.bpm  # the last tempo this server sent to the session
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ableton-link", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise StreamStudioError(f"--link: Ableton Link did not start ({self._error})") from self._error
        log.info("Ableton Link on: the tempo follows the session's")

    def _run(self) -> None:
        try:
            asyncio.run(self._follow())
        except Exception as exc:  # pragma: no cover - said by __init__ or logged
            self._error = exc
            self._ready.set()
            log.exception("Ableton Link stopped")

    async def _follow(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        link = self._aalink.Link(self.clock.bpm)
        link.quantum = QUANTUM
        link.enabled = True
        self._ready.set()
        try:
            while not self._stop.is_set():
                self.step(link, time.monotonic())
                try:
                    await asyncio.wait_for(self._stop.wait(), self.period_s)
                except asyncio.TimeoutError:
                    pass
        finally:
            link.enabled = False

    def step(self, link, now: float) -> None:
        """One look at the session: a tempo set here goes out, else the session's tempo and beat come in."""
        self.peers = link.num_peers
        if self.clock.source != "link" and abs(self.clock.bpm - self._pushed) > 1e-6:
            link.tempo = self._pushed = self.clock.bpm  # set, tapped or MIDI here: the session follows
        else:
            self._pushed = link.tempo
        self.clock.follow(link.tempo, link.beat, now, "link")

    def close(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(5)
