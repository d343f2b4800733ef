"""The WHIP and WHEP sessions of one server and their media: a publisher's tracks into its
stream's session, a viewer's tracks from its stream's `fanout.Broadcaster`, when one replaces
another, the watchdogs that end a session whose stream ended, that never connected or whose viewer
went silent, and the end that tells a viewer's event stream. The HTTP side is app/web/whip.py."""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import time
from typing import TYPE_CHECKING, Callable

from streamstudio.app.web.fanout import CODECS, Broadcaster, viewer_track_class
from streamstudio.app.web.security import ANONYMOUS
from streamstudio.app.web.sessions import Pending, SessionManager

if TYPE_CHECKING:
    from streamstudio.app.web.sessions import StreamSession
from streamstudio.app.web.webrtc import OfferRefused
from streamstudio.app.perform.inputs import audio_samples, stream_audio
from streamstudio.app.web.rtp_receive import receive_video_without_delay

log = logging.getLogger(__name__)

# A viewer that sends no RTCP receiver report for this long while packets go to it is gone (its
# process died, its network dropped): it is ended then, not when ICE consent fails (about 30 s).
# Players report every second or so (aiortc every 0.5-1.5 s, browsers about 1 s).
VIEWER_SILENCE_S = 5.0
# A live publisher that has sent no video frame for this long (an encoder that crashed or lost its
# network) may be replaced by a publisher with another credential, or on an open door by anyone.
STALE_PUBLISHER_S = 3.0


class Resource:
    """A WHIP or WHEP session: its peer connection and the tasks that serve it."""

    def __init__(self, kind: str, sid: str, pc, name: str | None = None):
        self.kind, self.sid, self.pc = kind, sid, pc
        self.source: str | None = None  # the client's address
        self.report: tuple | None = None  # a viewer's last RTCP report seen (`viewer_silent`)
        self.rtt: float | None = None  # a viewer's round-trip time from its RTCP receiver reports, seconds
        self.name = name or sid  # the stream as its URL names it (a viewer's: the watch id)
        self.rid = secrets.token_urlsafe(16)
        self.etag = ""
        self.created = time.monotonic()
        self.last_media = self.created  # a publisher's last video frame (`stale`)
        self.identity = ANONYMOUS  # the credential it came with (`security.Credentials`)
        self.listeners: list[asyncio.Queue] = []  # a viewer's event streams (WhipServer._events)
        self.tasks: list[asyncio.Task] = []
        self.tracks: list = []
        self.session: StreamSession | None = None  # the stream it publishes or watches
        self.closed = False

    @property
    def location(self) -> str:
        return f"/{self.kind}/{self.name}/{self.rid}"

class WhipSessions:
    """Every WHIP and WHEP session of one server, by resource id, and each stream's broadcaster."""

    def __init__(self, manager: SessionManager, pending_timeout: float, max_viewers: int,
                 max_viewers_per_source: int, other_slots: Callable[[], set] = set):
        self.manager, self.pending_timeout = manager, pending_timeout
        self.max_viewers, self.max_viewers_per_source = max_viewers, max_viewers_per_source
        self.other_slots = other_slots  # stream ids other front ends hold without a session yet
        self.resources: dict[str, Resource] = {}
        self.broadcasters: dict[str, Broadcaster] = {}
        manager.pending_lists.append(self.pending_connections)
        for kind in ("whip", "whep"):
            manager.peer_counters[kind] = functools.partial(count, self.resources, kind)

    def publisher(self, sid: str) -> Resource | None:
        """The live WHIP publisher of stream `sid`, which a new POST to the same name replaces
        (an encoder reconnecting after a crash or a network drop, without DELETE: as MediaMTX
        does by default); None when the stream has no such publisher (its source is a page or a
        /webrtc/offer client, or it ended)."""
        session = self.manager.get(sid)
        for res in self.resources.values():
            if res.kind == "whip" and res.sid == sid and not res.closed and res.session is not None \
                    and res.session is session and not session.closed:
                return res
        return None

    def check_replace(self, old: Resource, who: str) -> None:
        """A new publisher may take over the live publisher `old` of its stream only with the same
        credential (an encoder reconnecting: at once), or once `old` is stale (no frame for
        STALE_PUBLISHER_S seconds, or its connection failed); anyone else gets 409."""
        if who != ANONYMOUS and who == old.identity:
            return
        if stale(old):
            return
        raise OfferRefused("stream_in_use", f"the stream {old.sid!r} has a live publisher: a reconnect needs the same "
                           f"credential, or waits until it has sent nothing for {STALE_PUBLISHER_S:g} s", 409)

    def check_in_use(self, sid: str) -> None:
        if self.manager.get(sid) is not None or sid in self.other_slots() or \
                any(r.sid == sid and r.kind == "whip" for r in self.resources.values()):
            raise OfferRefused("stream_in_use", f"the stream {sid!r} already has a source", 409)

    def full(self) -> bool:
        in_use = set(self.manager.ids()) | set(self.other_slots())
        return len(in_use) >= self.manager.max_streams or not self.manager.has_capacity()

    def pending_connections(self) -> list[Pending]:
        """WHIP publishers that have sent no frame yet, for the server's cap (`webrtc.make_room`)."""
        return [Pending(r.source, r.created, functools.partial(self.end, r, "ended to make room: it sent no frame"))
                for r in list(self.resources.values())
                if r.kind == "whip" and not r.closed and (r.session is None or r.session.frames_in == 0)]

    def check_view(self, name: str, source: str | None) -> str:
        """The id of the stream a viewer asks for by `name` (`SessionManager.watched`), within the
        viewers the server takes and those one source address may hold."""
        session = self.manager.watched(name)
        if session is None or session.closed:
            raise OfferRefused("no_stream", f"no running stream {name!r}: start publishing to it first", 404)
        viewers = [r for r in self.resources.values() if r.kind == "whep"]
        if source is not None and sum(r.source == source for r in viewers) >= self.max_viewers_per_source:
            raise OfferRefused("too_many_viewers", f"your address has {self.max_viewers_per_source} viewers open "
                                                   "already, the most one address may (--max-viewers-per-source)", 429)
        if len(viewers) >= self.max_viewers:
            raise OfferRefused("busy", f"StreamStudio has {self.max_viewers} viewers already (--max-viewers)", 503)
        return session.sid

    async def discard(self, pc, sid: str | None) -> None:
        if pc is not None:
            try:
                await pc.close()
            except Exception:
                log.debug("closing a refused connection", exc_info=True)
        if sid is not None:
            self.manager.close(sid, wait=0.0)

    def on_publisher_track(self, res: Resource, track) -> None:
        res.tracks.append(track)
        if track.kind == "video":
            receive_video_without_delay(res.pc)  # a frame decoded at its last packet, not a frame later
        if track.kind == "video" and not any(t.kind == "video" for t in res.tracks[:-1]):
            res.tasks.append(asyncio.ensure_future(read_video(res, track)))
        elif track.kind == "audio" and not any(t.kind == "audio" for t in res.tracks[:-1]):
            res.tasks.append(asyncio.ensure_future(self._read_audio(res, track)))
        else:  # a second track of a kind: read and dropped, so its frames do not pile up
            res.tasks.append(asyncio.ensure_future(drain(track)))

    async def _read_audio(self, res: Resource, track) -> None:
        from aiortc.mediastreams import MediaStreamError

        while not res.closed:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            broadcaster = self.broadcasters.get(res.sid)
            if broadcaster is not None and broadcaster.session is res.session:
                broadcaster.push_audio(frame)
            listen(self.manager, res.sid, frame)

    def _broadcaster(self, sid: str) -> Broadcaster:
        session = self.manager.get(sid)
        b = self.broadcasters.get(sid)
        if b is not None and b.session is not session:
            b.close()
            b = None
        if b is None:
            b = self.broadcasters[sid] = Broadcaster(sid, session, asyncio.get_running_loop())
            b.has_audio = any(r.kind == "whip" and r.sid == sid and r.session is session
                              and any(t.kind == "audio" for t in r.tracks) for r in self.resources.values())
        return b

    def add_viewer_tracks(self, res: Resource) -> None:
        Track = viewer_track_class()
        b = self._broadcaster(res.sid)
        kinds = [t.kind for t in res.pc.getTransceivers()]
        video = Track("video")
        video.send_through(res.pc)
        res.tracks.append(video)
        if b.has_audio and "audio" in kinds:
            audio = Track("audio")
            res.pc.addTrack(audio)
            res.tracks.append(audio)
        res.session = b.session

    def bind_viewer(self, res: Resource) -> None:
        b = self._broadcaster(res.sid)
        video = res.tracks[0]
        transceiver = next(t for t in res.pc.getTransceivers() if t.sender is video.sender)
        codecs = [c.mimeType.split("/")[-1].lower() for c in transceiver._codecs if
                  c.mimeType.split("/")[-1].lower() in CODECS]
        if not codecs:
            raise OfferRefused("unsupported_codec", "the offer has no VP8 or H.264 video codec")
        b.add_video(codecs[0], video)
        for track in res.tracks[1:]:
            b.audio.add(track)

    def on_state(self, res: Resource) -> None:
        if res.pc.connectionState in ("failed", "closed") and not res.closed:
            asyncio.ensure_future(self.end(res, f"connection {res.pc.connectionState}"))

    async def watch(self, res: Resource) -> None:
        """End a session whose stream has gone (freed, idle, failed) or that has not connected
        (or, a publisher, sent no frame) within pending_timeout seconds."""
        step = min(0.5, self.pending_timeout / 5)
        while not res.closed:
            await asyncio.sleep(step)
            session, now = res.session, time.monotonic()
            if session is None or session.closed or self.manager.get(res.sid) is not session:
                reason = "the stream stopped" if session is not None and session.error else "the stream ended"
                return await self.end(res, reason)
            if res.kind == "whep" and res.pc.connectionState == "connected":
                if await viewer_silent(res, now):
                    return await self.end(res, f"the viewer sent no report for {VIEWER_SILENCE_S:.0f} s")
                viewer_path(self.manager, res)
            if now - res.created > self.pending_timeout:
                if res.pc.connectionState != "connected":
                    return await self.end(res, f"not connected after {self.pending_timeout:.0f} s")
                if res.kind == "whip" and session.frames_in == 0:
                    return await self.end(res, f"no frame after {self.pending_timeout:.0f} s")

    async def end(self, res: Resource, reason: str) -> None:
        if res.closed:
            return
        res.closed = True
        self.resources.pop(res.rid, None)
        log.info("%s session %s of stream %s ended: %s", res.kind.upper(), res.rid[:6], res.sid, reason)
        current = asyncio.current_task()
        for task in res.tasks:
            if task is not current:
                task.cancel()
        if res.kind == "whep":
            res.rtt = None
            viewer_path(self.manager, res)  # its RTT no longer counts in the stream's latency offset
            b = self.broadcasters.get(res.sid)
            for track in res.tracks:
                if b is not None:
                    b.remove(track)
                track.stop()
            self.prune(res.sid)
        try:
            await res.pc.close()
        except Exception:
            log.debug("closing %s", res.rid, exc_info=True)
        for queue in res.listeners:  # its event streams: "inactive", then they end
            queue.put_nowait(("inactive", {"reason": reason}))
            queue.put_nowait(None)
        if res.kind == "whip" and res.session is not None and self.manager.get(res.sid) is res.session:
            self.manager.close(res.sid, wait=0.0)
            for viewer in [r for r in list(self.resources.values()) if r.kind == "whep" and r.sid == res.sid]:
                await self.end(viewer, "the publisher ended")  # told now, not at the next watch step

    def prune(self, sid: str) -> None:
        """Drop `sid`'s broadcaster once it has no viewer (its encoders detached from the stream)."""
        b = self.broadcasters.get(sid)
        if b is not None and b.viewers == 0 and not b.audio:
            self.broadcasters.pop(sid, None)
            b.close()

    def find(self, kind: str, stream: str | None, rid: str) -> Resource:
        res = self.resources.get(rid)
        if res is None or res.kind != kind or res.name != stream:
            raise OfferRefused("no_session", f"no {kind.upper()} session here", 404)
        return res

    def status(self) -> dict:
        return {"publishers": sum(r.kind == "whip" for r in self.resources.values()),
                "viewers": sum(r.kind == "whep" for r in self.resources.values()),
                "streams": {sid: b.stats() for sid, b in self.broadcasters.items()}}

    async def close(self) -> None:
        for res in list(self.resources.values()):
            await self.end(res, "server stopping")
        for b in self.broadcasters.values():
            b.close()
        self.broadcasters.clear()


def stale(res: Resource) -> bool:
    if res.pc.connectionState in ("failed", "closed") or res.pc.iceConnectionState == "failed":
        return True
    return time.monotonic() - res.last_media > STALE_PUBLISHER_S


async def read_video(res: Resource, track) -> None:
    from aiortc.mediastreams import MediaStreamError

    while not res.closed:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        session = res.session
        if session is None or session.closed:
            return
        res.last_media = time.monotonic()
        session.submit(frame.to_ndarray(format="rgb24"))


async def drain(track) -> None:
    from aiortc.mediastreams import MediaStreamError

    try:
        while True:
            await track.recv()
    except MediaStreamError:
        return


async def viewer_silent(res: Resource, now: float) -> bool:
    """Whether the viewer `res` has sent no RTCP report for VIEWER_SILENCE_S seconds while
    packets went to it (a stream with no frames, e.g. a paused publisher, drops nobody)."""
    sender = getattr(res.tracks[0], "sender", None) if res.tracks else None
    if sender is None:
        return False
    stamp, sent = None, 0
    for stat in (await sender.getStats()).values():
        if stat.type == "remote-inbound-rtp":
            stamp = stat.timestamp
            res.rtt = getattr(stat, "roundTripTime", None)  # (aiortc: from the report's LSR and DLSR)
        elif stat.type == "outbound-rtp":
            sent = stat.packetsSent
    if res.report is None or stamp != res.report[0]:
        res.report = (stamp, now, sent)  # (the viewer's last report, when it came, packets sent then)
        return False
    _, heard, sent_then = res.report
    return now - heard > VIEWER_SILENCE_S and sent > sent_then


def viewer_path(manager, res: Resource) -> None:
    """A WHEP viewer's round-trip time into its stream's audio latency offset (app/perform/latency.py)."""
    inputs = getattr(manager, "inputs", None)
    if inputs is not None:
        inputs.latency.viewer_rtt(res.sid, res.rid, res.rtt)


def count(resources: dict, kind: str) -> int:
    return sum(r.kind == kind for r in list(resources.values()))


AUDIO_RECEIVE_HOLD = 4  # aiortc's RTCRtpReceiver: JitterBuffer(capacity=16, prefetch=4) for audio


def listen(manager, sid: str, frame) -> None:
    """A publisher's audio frame to its stream's modulations, when one of them reads audio (issue 48)."""
    mods = getattr(manager.get(sid), "modulations", None)
    if getattr(manager, "inputs", None) is None or mods is None or not mods.uses("audio"):
        return  # (not decoded for nothing)
    samples, rate, channels = audio_samples(frame)
    # the frame's last sample was captured about AUDIO_RECEIVE_HOLD frames before it reached us: aiortc's
    # audio jitter buffer releases a packet once that many more are queued (a 20 ms Opus frame: 80 ms)
    held = AUDIO_RECEIVE_HOLD * len(samples) / max(1, channels) / rate
    stream_audio(manager, sid, samples, rate, time.monotonic() - held, channels)


async def end_orphans(sessions: WhipSessions, sid: str) -> None:
    """End the WHIP publishers of stream `sid` whose stream has ended (closed by its idle timeout,
    by DELETE on its session, by the server) while their connection has not failed yet: they no
    longer hold the name, so a new publisher of it is not refused meanwhile."""
    current = sessions.manager.get(sid)
    for res in list(sessions.resources.values()):
        if res.kind == "whip" and res.sid == sid and res.session is not None and res.session is not current:
            await sessions.end(res, "its stream ended")
