"""The latency probe (`serve --latency-probe`, benchmarks/webapp.py and glass_to_glass.py): a frame
counter drawn as black and white blocks across a frame's top band, read back from an output after
the network and the codecs, so glass-to-glass latency is measured on the pictures themselves."""

from __future__ import annotations

import numpy as np

PROBE_BITS = 10  # latency probe: a frame counter drawn as blocks in the top band
PROBE_BLOCKS = PROBE_BITS + 2  # plus a white start and a black end block


def draw_probe(frame: np.ndarray, value: int) -> np.ndarray:
    """Draw `value` (mod 2**PROBE_BITS) as black/white blocks across the top sixth of `frame`."""
    h, w = frame.shape[:2]
    bw, bh = w // PROBE_BLOCKS, max(2, h // 6)
    bits = [1] + [(value >> (PROBE_BITS - 1 - i)) & 1 for i in range(PROBE_BITS)] + [0]
    for i, bit in enumerate(bits):
        frame[:bh, i * bw:(i + 1) * bw] = 255 * bit
    return frame


def read_probe(frame: np.ndarray) -> int | None:
    """The value `draw_probe` drew (None when the guard blocks are not there)."""
    h, w = frame.shape[:2]
    bw, bh = w // PROBE_BLOCKS, max(2, h // 6)
    if bw < 1:
        return None
    centres = frame[bh // 2, [i * bw + bw // 2 for i in range(PROBE_BLOCKS)]].astype(np.float32).mean(axis=-1)
    bits = [int(c > 127) for c in centres]
    if bits[0] != 1 or bits[-1] != 0:
        return None
    return int("".join(map(str, bits[1:-1])), 2)
