"""What modulation costs a frame (issue 48's target: under 1 ms): the mappings' values at a frame's
time (8 mappings: LFOs, the beat, a MIDI knob, an audio feature) and the image stream taking the
changed settings (`StreamDiffusion.update`, what a session's runner does before the frame), timed
on the tiny model here (the settings' cost does not depend on the model's size), and the audio
analysis's cost per second of audio (48 kHz stereo, 100 feature frames a second).

    python3 benchmarks/modulation.py       # writes benchmarks/results/modulation.json
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from common import RESULTS, utc_now, write_json  # puts the package on sys.path

from streamstudio.app.perform.audio_features import AudioFeatures
from streamstudio.app.perform.inputs import LiveInputs
from streamstudio.app.perform.modulation import Modulations
from streamstudio.models.image.loading import load_components
from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion, StreamDiffusionConfig

TARGET_MS = 1.0
MAPPINGS = {"mappings": [
    {"setting": "strength", "source": {"kind": "lfo", "shape": "sine", "rate": 0.5}, "low": 0.3, "high": 0.8},
    {"setting": "guidance_scale", "source": {"kind": "lfo", "shape": "triangle", "beats": 4}, "low": 1.0, "high": 2.0},
    {"setting": "delta", "source": {"kind": "midi", "cc": 74}, "smoothing": 0.1},
    {"setting": "feedback_weight", "source": {"kind": "beat", "beats": 1}, "low": 0.1, "high": 0.5},
    {"setting": "bank_fusion", "source": {"kind": "audio", "feature": "low"}, "smoothing": 0.05},
    {"setting": "similarity_threshold", "source": {"kind": "lfo", "shape": "saw", "rate": 0.2},
     "low": 0.9, "high": 0.99},
    {"setting": "ip_adapter_scale", "source": {"kind": "lfo", "shape": "square", "rate": 1.0}},
    {"setting": "seed", "source": {"kind": "lfo", "shape": "random", "beats": 8}, "low": 0, "high": 1000}]}


def main() -> int:
    torch.set_num_threads(2)
    inputs = LiveInputs()
    inputs.control_change(74, 90)
    rng = np.random.default_rng(0)
    inputs.feed_audio("s", rng.standard_normal(48_000 * 2).astype(np.float32) * 0.1, 48_000, time.monotonic(), 2)
    view = inputs.view("s")
    mods = Modulations.parse(MAPPINGS)
    comps = load_components("tiny", device="cpu", dtype=torch.float32)
    pipe = StreamDiffusion(comps, StreamDiffusionConfig(width=64, height=64, steps=1, strength=0.5), prompt="a fox")
    values_ms, update_ms = [], []
    for i in range(400):
        t = time.monotonic()
        t0 = time.perf_counter()
        values = mods.values(t, inputs.clock, view)
        t1 = time.perf_counter()
        values.pop("ip_adapter_scale", None)  # the tiny model has no IP-Adapter
        pipe.update(**values)
        t2 = time.perf_counter()
        if i >= 50:
            values_ms.append((t1 - t0) * 1e3)
            update_ms.append((t2 - t1) * 1e3)
        time.sleep(0.001)
    features = AudioFeatures(48_000)
    audio = rng.standard_normal(48_000 * 2 * 5).astype(np.float32) * 0.1
    t0 = time.perf_counter()
    for k in range(50):  # 5 s of stereo in 100 ms pieces
        features.push(audio[k * 9600:(k + 1) * 9600], t_end=k * 0.1, channels=2)
    audio_ms_per_s = (time.perf_counter() - t0) * 1e3 / 5
    total = statistics.median(values_ms) + statistics.median(update_ms)
    result = {"benchmark": "modulation", "date": utc_now(), "mappings": len(MAPPINGS["mappings"]),
              "values_ms_median": statistics.median(values_ms), "update_ms_median": statistics.median(update_ms),
              "update_ms_p90": float(np.percentile(update_ms, 90)), "per_frame_ms": total, "target_ms": TARGET_MS,
              "met": total < TARGET_MS, "audio_analysis_ms_per_audio_s": audio_ms_per_s}
    write_json(RESULTS / "modulation.json", result)
    print(f"8 mappings: values {result['values_ms_median']:.3f} ms, the stream taking them "
          f"{result['update_ms_median']:.3f} ms (p90 {result['update_ms_p90']:.3f}); per frame {total:.3f} ms "
          f"(target < {TARGET_MS} ms: {'met' if result['met'] else 'MISSED'}); audio analysis "
          f"{audio_ms_per_s:.1f} ms per second of 48 kHz stereo")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
