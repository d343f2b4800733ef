"""The video jitter buffer that hands a frame on at its marker packet (app/web/rtp_receive.py),
against aiortc's own on the same packets: the same frames, with the same bytes, one packet
sooner each (aiortc's waits for the next frame's first packet); a frame missing a packet, or
whose marker comes before the rest, is not handed on early. (A WHIP publisher's receiver using
it: tests/web/test_whip_whep.py::test_publish_view_delete.)"""

from __future__ import annotations

from aiortc.jitterbuffer import JitterBuffer
from aiortc.rtp import RtpPacket

from streamstudio.app.web.rtp_receive import MarkerJitterBuffer


def packets(frames: list[int], first_seq: int = 65530) -> list[RtpPacket]:
    """Frame i of frames[i] packets at RTP timestamp 3000 i, the marker on its last packet; the
    sequence numbers wrap past 65535."""
    out, seq = [], first_seq
    for i, count in enumerate(frames):
        for k in range(count):
            p = RtpPacket(payload_type=96, marker=int(k == count - 1), sequence_number=seq % 65536,
                          timestamp=3000 * i, payload=b"")
            p._data = bytes([i, k])  # what the receiver's depayloader leaves on a packet
            out.append(p)
            seq += 1
    return out


def feed(buffer, stream: list[RtpPacket]) -> list[tuple[int, int, bytes]]:
    """(index of the packet it came at, timestamp, bytes) of every frame handed on."""
    got = []
    for n, p in enumerate(stream):
        _, frame = buffer.add(p)
        if frame is not None:
            got.append((n, frame.timestamp, frame.data))
    return got


def test_frames_are_handed_on_at_their_last_packet_with_the_same_bytes():
    stream = packets([3, 1, 4, 2, 2])
    stock = feed(JitterBuffer(capacity=512, is_video=True), stream)
    ours = feed(MarkerJitterBuffer(), stream)
    assert [(t, d) for _, t, d in stock] == [(t, d) for _, t, d in ours][:len(stock)]
    assert len(ours) == 5 and len(stock) == 4  # the last frame: aiortc's waits for a sixth
    ends = [2, 3, 7, 9, 11]  # the packet index each frame ends at
    assert [n for n, _, _ in ours] == ends
    assert [n for n, _, _ in stock] == [e + 1 for e in ends[:4]]  # one packet (a frame interval) later


def test_an_incomplete_or_reordered_frame_waits_as_before():
    stream = packets([3, 2, 2])
    lost = stream[:1] + stream[2:]  # frame 0 lost its middle packet
    assert [t for _, t, _ in feed(MarkerJitterBuffer(), lost)] == \
        [t for _, t, _ in feed(JitterBuffer(capacity=512, is_video=True), lost)]
    reordered = [stream[0], stream[2], stream[1], *stream[3:]]  # frame 0's marker before its middle
    ours, stock = feed(MarkerJitterBuffer(), reordered), feed(JitterBuffer(capacity=512, is_video=True), reordered)
    assert ours[0] == stock[0] and ours[0][0] == 3  # frame 0 at the next frame's first packet, as aiortc
    assert [d for _, _, d in ours] == [d for _, _, d in stock] + [ours[-1][2]]
