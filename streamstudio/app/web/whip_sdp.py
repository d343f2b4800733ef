"""The SDP of WHIP and WHEP (RFC 9725): an offer's checks, the session's entity tag, a trickle
PATCH's candidates, and the server's ICE servers as aiortc's configuration."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from streamstudio.app.web.fanout import CODECS
from streamstudio.app.web.webrtc import MAX_CANDIDATES, OfferRefused, check_offer_sdp

if TYPE_CHECKING:
    from aiortc import RTCIceCandidate


def check_sdp(sdp: Any, role: str) -> None:
    """Refuse an SDP offer that could not make a working WHIP (role "whip": the client sends
    video, maybe audio) or WHEP (role "whep": the client receives) session: the checks of
    `webrtc.check_offer_sdp` for audio and video without a data channel, then the direction
    and the codecs."""
    parsed = check_offer_sdp(sdp, kinds=("video", "audio"), rtcp_mux_kinds=("video", "audio"))
    sending = ("sendonly", "sendrecv") if role == "whip" else ("recvonly", "sendrecv")
    video = [m for m in parsed.media if m.kind == "video"]
    if not any((m.direction or "sendrecv") in sending for m in video):
        raise OfferRefused("bad_sdp", "the video m= line must be " + (
            "sendonly (a WHIP client publishes)" if role == "whip" else "recvonly (a WHEP client watches)"))
    names = {c.name.lower() for m in video for c in m.rtp.codecs}
    if not names & set(CODECS):
        raise OfferRefused("unsupported_codec", "the offer has no VP8 or H.264 video codec", 400)


def rtc_configuration(rtc_config: dict | None):
    """aiortc's RTCConfiguration from the server's {iceServers: [...]} (webrtc.rtc_config_from_env)."""
    from aiortc import RTCConfiguration, RTCIceServer

    servers = [RTCIceServer(urls=s["urls"], username=s.get("username"), credential=s.get("credential"))
               for s in (rtc_config or {}).get("iceServers", [])]
    return RTCConfiguration(iceServers=servers)


def etag(sdp: str) -> str:
    """An entity tag for the ICE session: the answer's ice-ufrag and ice-pwd."""
    ice = [line for line in sdp.splitlines() if line.startswith(("a=ice-ufrag:", "a=ice-pwd:"))]
    return '"' + hashlib.sha256("\n".join(ice).encode()).hexdigest()[:16] + '"'


def trickle_candidates(frag: str, if_match: str, offer_ice: set[str]) -> list[RTCIceCandidate]:
    """The remote candidates of a trickle PATCH's `application/trickle-ice-sdpfrag` body (RFC 9725
    4.3), for a session whose offer had the ICE credentials `offer_ice`; OfferRefused for an ICE
    restart (`If-Match: *` or new credentials: 422, not supported) or a bad candidate (400).
    mDNS `.local` candidates are dropped: a server cannot resolve them (aiortc tried for a second
    per candidate); RFC 9725 4.3.2: a session "not able to resolve the connection address ...
    MUST silently discard the candidate". The browser's checks still reach us (peer-reflexive)."""
    from aiortc.sdp import candidate_from_sdp

    lines = [line.strip() for line in frag.splitlines() if line.strip()]
    if if_match == "*" or any(line.startswith(("a=ice-ufrag:", "a=ice-pwd:")) and line not in offer_ice
                              for line in lines):
        raise OfferRefused("ice_restart_unsupported", "ICE restarts are not supported: start a new session "
                           "(trickle ICE candidates are)", 422)
    candidates: list[RTCIceCandidate] = []
    mid: str | None = None
    for line in lines:
        if line.startswith("a=mid:"):
            mid = line[6:]
        elif line.startswith("a=candidate:"):
            if len(candidates) >= MAX_CANDIDATES or len(line) > 1024:
                raise OfferRefused("bad_candidate", f"at most {MAX_CANDIDATES} candidates of 1 KB")
            try:
                candidate = candidate_from_sdp(line[len("a=candidate:"):])
            except Exception:  # noqa: BLE001
                raise OfferRefused("bad_candidate", f"a candidate does not parse: {line[:80]}") from None
            candidate.sdpMid = mid
            if mid is None:
                candidate.sdpMLineIndex = 0
            if not candidate.ip.lower().endswith(".local"):
                candidates.append(candidate)
    return candidates
