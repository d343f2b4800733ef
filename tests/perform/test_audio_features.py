"""Audio features for modulation (app/perform/audio_features.py): on synthetic signals whose answer
is known without the code: a full-scale sine's RMS is 1/sqrt 2; a 100 Hz tone is all low band, a
1 kHz tone all mid, an 8 kHz tone all high; clicks in silence are onsets and steady tone is not;
the latency offset reads the audio heard that long ago; at least 50 feature frames a second."""

from __future__ import annotations

import math

import numpy as np
import pytest

from streamstudio.app.perform.audio_features import AudioFeatures

SR = 48_000


def tone(freq: float, seconds: float, amp: float = 1.0) -> np.ndarray:
    t = np.arange(int(SR * seconds)) / SR
    return (amp * np.sin(2 * math.pi * freq * t)).astype(np.float32)


@pytest.mark.parametrize("freq, band", [(100.0, "low"), (1000.0, "mid"), (8000.0, "high")])
def test_a_tone_lands_in_its_band_with_the_rms_of_a_sine(freq, band):
    f = AudioFeatures(SR, rate=100.0)
    made = f.push(tone(freq, 1.0, amp=0.5), t_end=1.0)
    assert made >= 98  # 100 frames a second (>= the 50)
    assert f.at("rms", 1.0) == pytest.approx(0.5 / math.sqrt(2), rel=0.02)
    assert f.at(band, 1.0) > 0.97


def test_int16_stereo_sums_the_channels_power():
    """The same sine on both channels at amplitude a: each channel's mean square a^2 / 2, summed a^2,
    so the RMS is a (a loudness meter's sum of channel powers)."""
    f = AudioFeatures(SR)
    x = (tone(1000.0, 0.5, amp=0.25) * 32767).astype(np.int16)
    f.push(np.stack([x, x], axis=1).ravel(), t_end=0.5, channels=2)
    assert f.at("rms", 0.5) == pytest.approx(0.25, rel=0.02)


def test_clicks_are_onsets_and_a_steady_tone_is_not():
    f = AudioFeatures(SR, rate=100.0, onset_hold_s=0.0)  # the analysis frames themselves, no hold
    steady = tone(440.0, 1.0, amp=0.3)
    f.push(steady, t_end=1.0)
    steady_onsets = sum(f.at("onset", 0.3 + k / 100) for k in range(60))
    x = np.zeros(SR, np.float32)  # then a second of silence with a click every 250 ms
    for k in range(4):
        x[k * SR // 4: k * SR // 4 + 96] = 0.9
    f.push(x, t_end=2.0)
    hits = [t for t in np.arange(1.0, 2.0, 0.01) if f.at("onset", float(t)) == 1.0]
    assert steady_onsets == 0
    assert len(hits) >= 4 and all(min(abs(t - (1.0 + k / 4)) for k in range(4)) <= 0.03 for t in hits), hits


def test_the_latency_offset_reads_what_was_heard_that_long_ago():
    f = AudioFeatures(SR, latency_s=0.5)
    f.push(tone(1000.0, 1.0, amp=0.8), t_end=1.0)  # loud until t=1
    f.push(np.zeros(SR, np.float32), t_end=2.0)  # then silence
    assert f.at("rms", 1.2) > 0.5  # at 1.2 the audience hears (and the picture should show) t=0.7
    assert f.at("rms", 1.7) < 0.01
    assert AudioFeatures(SR).at("rms", 5.0) is None  # no audio yet
    with pytest.raises(ValueError):
        AudioFeatures(SR, rate=10.0)
