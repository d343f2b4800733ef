"""ControlNet scales as modulation targets (issue 48): `control_scales.N` drives ControlNet N's
scale alone, the other nets keep theirs, and the frames equal a stream whose scales were set by
hand to the same values (the settings API's full list), on tiny ControlNets."""

from __future__ import annotations

import numpy as np
import pytest
from addon_models import make_pipe, stream_frames, tiny_controlnet

from streamstudio.app.perform.inputs import LiveInputs
from streamstudio.app.perform.modulation import Modulations, apply_at
from streamstudio.errors import StreamStudioError


@pytest.fixture(scope="module")
def sd():
    from streamstudio.models.image.loading import load_components

    comps = load_components("tiny")
    return comps, [tiny_controlnet(comps.unet, 0), tiny_controlnet(comps.unet, 1)]


def test_a_knob_on_one_controlnets_scale_leaves_the_other(sd):
    comps, nets = sd
    inputs = LiveInputs()
    mods = Modulations.parse({"mappings": [
        {"setting": "control_scales.1", "source": {"kind": "midi", "cc": 20}}]})  # range: the slider's 0..2
    modulated = make_pipe(comps, nets, scales=[0.8, 1.0], seed=5)
    by_hand = make_pipe(comps, nets, scales=[0.8, 1.0], seed=5)
    frames = stream_frames(6, seed=3)
    outs, hand = [], []
    for k, value in enumerate([127, 127, 0, 0, 64, 64]):  # the knob's positions, a frame each
        scale = value / 127 * 2.0  # linear over the add-on slider's 0..2 (docs/performance.md)
        inputs.control_change(20, value)
        got = mods.values(float(k), None, inputs)
        assert got == {"control_scales": {1: pytest.approx(scale)}}
        modulated.update(**got)
        by_hand.update(control_scales=[0.8, scale])  # the settings API's way: the whole list
        outs.append(modulated(frames[k]))
        hand.append(by_hand(frames[k]))
    scales = [u.scale for u in modulated.addons.control.units]
    assert scales == [0.8, pytest.approx(64 / 127 * 2)]  # net 0 kept its own
    for a, b in zip(outs, hand):
        if a is None or b is None:
            assert a is None and b is None
            continue
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # (the scale matters: at 2.0 and 0.0 the same input gives different frames)
    assert any(a is not None and not np.array_equal(np.asarray(a), np.asarray(outs[-1])) for a in outs[:4])


def test_a_controlnet_the_model_lacks_is_refused_at_its_frame(sd):
    comps, nets = sd
    pipe = make_pipe(comps, nets[:1], scales=[1.0], seed=5)
    mods = Modulations.parse({"mappings": [{"setting": "control_scales.3", "source": {"kind": "lfo"}}]})
    with pytest.raises(StreamStudioError, match=r"ControlNet\(s\) \[3\]; this model has 1"):
        apply_at(pipe, mods, None, 0.25)
    with pytest.raises(StreamStudioError, match="cannot be modulated"):
        Modulations.parse({"mappings": [{"setting": "control_scales.8", "source": {"kind": "lfo"}}]})
