"""The tiny models' weights are a function of their seed alone, whatever other threads draw.

Module constructors draw from torch's one global generator, which all threads share: before
`tiny.redraw_parameters`, a thread drawing noise while the tiny model was built (a stream still
running late in a test run, a second replica loading) gave other weights, and a batch render
then differed from a local render of the same file in every frame."""

from __future__ import annotations

import threading

import torch

from streamstudio.models.image.sdxl import tiny_sdxl_components
from streamstudio.models.image.tiny import redraw_parameters, tiny_components


def weights(comps: dict) -> dict[str, torch.Tensor]:
    return {f"{part}.{k}": v.clone() for part in ("unet", "vae", "text_encoder", "text_encoder_2", "taesd")
            if comps.get(part) is not None for k, v in comps[part].state_dict().items()}


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []


def build_while_another_thread_draws(build) -> dict:
    stop = threading.Event()

    def draw():
        while not stop.is_set():
            torch.randn(256)

    thread = threading.Thread(target=draw, daemon=True)
    thread.start()
    try:
        return weights(build())
    finally:
        stop.set()
        thread.join()


def test_tiny_weights_do_not_depend_on_other_threads_draws():
    quiet = weights(tiny_components(taesd=True))
    for _ in range(3):
        assert_same(build_while_another_thread_draws(lambda: tiny_components(taesd=True)), quiet)
    assert_same(build_while_another_thread_draws(tiny_sdxl_components), weights(tiny_sdxl_components()))
    other = weights(tiny_components(seed=1))
    assert any(not torch.equal(quiet[k], other[k]) for k in quiet)


def test_redraw_keeps_constants_and_scales_by_fan_in():
    layer = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.LayerNorm(16))
    torch.nn.init.zeros_(layer[0].bias)
    redraw_parameters(layer, 0)
    w = layer[0].weight.detach()
    assert float(w.abs().max()) <= 64 ** -0.5 and float(w.abs().max()) > 0.9 * 64 ** -0.5
    assert torch.equal(layer[0].bias, torch.zeros(16)) and torch.equal(layer[1].weight, torch.ones(16))
    before = torch.random.get_rng_state()
    redraw_parameters(layer, 0)
    assert torch.equal(torch.random.get_rng_state(), before)  # the global stream is not touched
