"""The Stream Batch sampler (pipelines/image/stream_batch.py) on a network computed by hand: the ids
of the groups that leave keep input order through priming and filler calls, and each id
leaves with its own group's latents (those sequential denoising gives that input)."""

from __future__ import annotations

import pytest
import torch

from streamstudio.kernels.reference import CFG_NONE, CFG_SELF
from streamstudio.models.image.image_net import ImageCond, ImageNet
from streamstudio.pipelines.image.stream_batch import PRIMED, Guidance, Schedule, StreamBatchSampler

SHAPE = (4, 2, 2)


class LinearNet(ImageNet):
    """eps = 0.1 x + t / 1000 + mean(text): rows independent, cheap."""

    device, dtype, latent_channels, latent_scale = torch.device("cpu"), torch.float32, 4, 8

    def __init__(self):
        self.rows = []

    @property
    def eager(self):
        return self

    def eps(self, x, t, cond, bank=None):
        self.rows.append(x.shape[0])
        return 0.1 * x + t.view(-1, 1, 1, 1) / 1000 + cond.text.mean((1, 2)).view(-1, 1, 1, 1)


def schedule(n: int) -> Schedule:
    """N steps of an LCM-like schedule written out: abar falls with the timestep."""
    t = torch.tensor([999, 759, 499, 259][:n])
    abar = torch.linspace(0.05, 0.8, n, dtype=torch.float64)
    alpha, beta = abar.sqrt(), (1 - abar).sqrt()
    c_skip, c_out = torch.full((n,), 0.1, dtype=torch.float64), torch.full((n,), 0.9, dtype=torch.float64)
    one = torch.ones(1, dtype=torch.float64)
    coef = torch.stack([alpha, beta, c_skip, c_out, torch.cat([alpha[1:], one]), torch.cat([beta[1:], one])], 1)
    return Schedule(t, coef.float())


GUIDE = Guidance(ImageCond(text=torch.full((1, 3, 2), 0.2)), ImageCond(text=torch.zeros(1, 3, 2)), CFG_SELF, 1.5, 0.8)


def sampler(n: int, k: int = 1, stream_batch: bool = True) -> StreamBatchSampler:
    return StreamBatchSampler(LinearNet(), schedule(n), frames=k, stream_batch=stream_batch, latent_shape=SHAPE,
                              seed=3)


@pytest.mark.parametrize("n,k", [(2, 1), (3, 1), (4, 2)])
def test_ids_leave_in_input_order_through_priming_and_fillers(n, k):
    s = sampler(n, k)
    inputs = [torch.full((k, *SHAPE), float(i)) for i in range(5)]
    left, outs = [], {}
    for i, x in enumerate(inputs):
        out, group = s.advance(x, i, GUIDE)
        left.append(group)
        outs[group] = out
    assert s.in_flight == list(range(5 - (n - 1), 5))  # the newest N - 1 inputs, oldest first
    while s.in_flight:  # flush: fillers (the last input again) until every input is out
        out, group = s.advance(inputs[-1], PRIMED, GUIDE)
        left.append(group)
        outs[group] = out
    assert left == [PRIMED] * (n - 1) + list(range(5))
    alone = sampler(n, k, stream_batch=False)  # the same noise: each input's own trajectory
    for i, x in enumerate(inputs):
        want, group = alone.advance(x, i, GUIDE)
        assert group == i
        torch.testing.assert_close(outs[i], want, atol=1e-5, rtol=1e-5)


def test_one_network_call_per_group_once_primed():
    s = sampler(3)
    s.advance(torch.zeros(1, *SHAPE), 0, GUIDE)  # priming: 2 single-group steps, then the batched call
    assert s.net.rows == [1, 1, 3]  # self CFG: one pass per row (initialize would add the first step's uncond)
    s.net.rows.clear()
    for i in range(1, 4):
        s.advance(torch.zeros(1, *SHAPE), i, GUIDE)
    assert s.net.rows == [3, 3, 3] and s.unet_rows == 1 + 1 + 3 + 9
    s.reset()
    assert s.in_flight == [] and s.advance(torch.zeros(1, *SHAPE), 9, GUIDE)[1] == PRIMED  # primes again


def test_txt2img_groups_draw_fresh_noise():
    s = sampler(1)
    none = Guidance(GUIDE.text, GUIDE.negative, CFG_NONE, 1.0, 1.0)
    a, _ = s.advance(None, 0, none)
    b, _ = s.advance(None, 1, none)
    assert not torch.allclose(a, b)


def test_a_v_prediction_model_gives_the_true_eps():
    """v_prediction (Salimans & Ho 2022): for x_t = alpha x0 + beta eps the model outputs
    v = alpha eps - beta x0; the sampler turns the true v back into the true eps at every level."""
    s = StreamBatchSampler(LinearNet(), schedule(4), frames=1, stream_batch=True, latent_shape=SHAPE, seed=3,
                           v_prediction=True)
    coef = schedule(4).coef  # (N, 6): alpha, beta, ...
    alpha, beta = coef[:, 0].view(-1, 1, 1, 1), coef[:, 1].view(-1, 1, 1, 1)
    gen = torch.Generator().manual_seed(0)
    x0, eps = torch.randn(4, *SHAPE, generator=gen), torch.randn(4, *SHAPE, generator=gen)
    x_t = alpha * x0 + beta * eps
    torch.testing.assert_close(s._to_eps(alpha * eps - beta * x0, x_t, coef), eps, rtol=0, atol=1e-5)
