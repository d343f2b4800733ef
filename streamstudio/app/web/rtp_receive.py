"""aiortc's video receive without waiting a frame: a jitter buffer that hands a frame on when
its last packet arrives.

aiortc's `JitterBuffer` knows a video frame is complete only when a packet of the *next* frame
arrives (its RTP timestamp differs), so every received frame waits one frame interval (33 ms at
30 fps, more from a slower publisher) before it is decoded: measured by
benchmarks/glass_to_glass.py as most of the publisher-to-server leg. The sender marks a frame's
last packet: "The marker bit MUST be set on the last packet of a frame" (VP8, RFC 7741 4.1;
H.264: "set for the very last packet of the access unit", RFC 6184 5.1). `MarkerJitterBuffer`
hands the frame on at that packet when every packet from the buffer's origin to it is there and
of the frame's timestamp; otherwise (a packet lost or reordered) it waits as aiortc does, so
what is decoded is the same, only sooner (tests/web/test_rtp_receive.py).
"""

from __future__ import annotations

from aiortc.jitterbuffer import JitterBuffer, JitterFrame
from aiortc.utils import uint16_add

VIDEO_CAPACITY = 512  # aiortc's own for video


class MarkerJitterBuffer(JitterBuffer):
    def __init__(self, capacity: int = VIDEO_CAPACITY):
        super().__init__(capacity=capacity, is_video=True)
        self.early = 0  # frames handed on at their marker packet

    def add(self, packet):
        pli, frame = super().add(packet)
        if frame is None and packet.marker:
            frame = self._complete_at(packet)
            self.early += frame is not None
        return pli, frame

    def _complete_at(self, last) -> JitterFrame | None:
        """The frame that ends at `last` when its packets from the origin on are all here."""
        origin = self._origin
        if origin is None:  # (no packet yet)
            return None
        count = uint16_add(last.sequence_number, -origin) + 1
        if count > self.capacity:
            return None
        packets = []
        for i in range(count):
            packet = self._packets[uint16_add(origin, i) % self.capacity]
            if packet is None or packet.timestamp != last.timestamp:
                return None
            packets.append(packet)
        self.remove(count)
        # (`_data`: the payload aiortc's receiver sets on each packet, which its own JitterBuffer joins)
        data = b"".join(p._data for p in packets)  # type: ignore[attr-defined]
        return JitterFrame(data=data, timestamp=last.timestamp)


def receive_video_without_delay(pc) -> int:
    """Give every receiver of remote video on `pc` (once its remote description is set, before
    media flow) a MarkerJitterBuffer; receivers that have one already, or whose aiortc keeps no
    such buffer, are left as they are. Returns how many were given one."""
    given = 0
    for transceiver in pc.getTransceivers() if pc is not None else ():
        receiver = transceiver.receiver
        track = receiver.track if receiver is not None else None
        buffer = getattr(receiver, "_RTCRtpReceiver__jitter_buffer", None)
        if track is not None and track.kind == "video" and type(buffer) is JitterBuffer:
            receiver._RTCRtpReceiver__jitter_buffer = MarkerJitterBuffer()
            given += 1
    return given
