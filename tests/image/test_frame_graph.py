"""The live frame as one captured graph with frames in flight (pipelines/image/frame_graph.py): its
outputs are the eager stream's, frame for frame, on a CPU (the frame function run directly) and
through the graph branch with the CUDA calls faked (capture, replay, pinned slots, events), across
settings that capture the graph again; frames a graph cannot hold run eagerly in order."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streamstudio.errors import StreamStudioError
from streamstudio.pipelines.image.frame_graph import CudaCalls, FrameGraph
from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion, StreamDiffusionConfig


class FakeEvent:
    def __init__(self, log):
        self.log = log

    def record(self):
        self.log.append("record")

    def synchronize(self):
        self.log.append("sync")


class FakeGraph:
    """A 'graph' that replays by running the function again into the captured output."""

    def __init__(self, fn, out, log):
        self.fn, self.out, self.log = fn, out, log

    def replay(self):
        self.log.append("replay")
        self.out.copy_(self.fn())


class FakeCalls(CudaCalls):
    """The CUDA calls on a CPU: capture runs the function once (as the warm-up does, advancing
    the stream's buffers, which FrameGraph must put back) and keeps its output as the static one."""

    def __init__(self):
        self.log: list[str] = []

    def pinned(self, shape, dtype=torch.uint8):
        self.log.append("pinned")
        return torch.empty(shape, dtype=dtype)

    def event(self):
        return FakeEvent(self.log)

    def side_stream(self, device):
        return "side"

    def on(self, stream):
        from contextlib import nullcontext

        self.log.append(f"on {stream}")
        return nullcontext()

    def wait_for(self, stream, tensor, device):
        self.log.append(f"wait {stream}")

    def capture(self, fn, device):
        self.log.append("capture")
        out = fn().clone()
        return FakeGraph(fn, out, self.log), out


def frames(count, size=64, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(count)]


def eager_outputs(comps, config, images, changes=None):
    stream = StreamDiffusion(comps, config, prompt="a red fox")
    outs = []
    for i, image in enumerate(images):
        for setting in (changes or {}).get(i, []):
            setting(stream)
        outs.append(np.copy(stream(image)))
    return outs


def graph_outputs(comps, config, images, depth, calls=None, changes=None):
    stream = StreamDiffusion(comps, config, prompt="a red fox")
    graph = FrameGraph(stream, depth=depth, graphs=calls is not None, calls=calls)
    outs = []
    for i, image in enumerate(images):
        for setting in (changes or {}).get(i, []):
            setting(stream)
        outs += graph.submit(image)
    outs += graph.drain()
    return outs, graph, stream


CONFIGS = {
    "1 step, no CFG": StreamDiffusionConfig(width=64, height=64, steps=1, strength=0.5, cfg_type="none"),
    "Stream Batch 2 steps, self CFG": StreamDiffusionConfig(width=64, height=64, steps=2, strength=0.6,
                                                            cfg_type="self", guidance_scale=1.4, delta=0.8),
    "2 frames a call, full CFG": StreamDiffusionConfig(width=64, height=64, steps=2, strength=0.6, cfg_type="full",
                                                       guidance_scale=1.5, frame_buffer_size=2),
}


def batched(images, k):
    return [images[i:i + k] for i in range(0, len(images), k)] if k > 1 else images


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("faked_gpu", [False, True], ids=["cpu", "faked-gpu"])
def test_graph_frames_equal_the_eager_streams(comps, name, faked_gpu):
    config = CONFIGS[name]
    images = batched(frames(6 * config.frame_buffer_size), config.frame_buffer_size)
    expected = eager_outputs(comps, config, images)
    calls = FakeCalls() if faked_gpu else None
    got, graph, stream = graph_outputs(comps, config, images, depth=2, calls=calls)
    assert len(got) == len(expected)
    for a, b in zip(expected, got):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    primes = 1 if stream.sampler.stream_batch else 0
    assert graph.replays == len(images) - primes  # the priming frame ran eagerly, every other one in the graph
    assert stream.stats.frames_in == 6 * config.frame_buffer_size and stream.stats.calls == len(images)
    if faked_gpu:
        assert graph.captures == 1 and calls.log.count("capture") == 1
        assert calls.log.count("replay") == graph.replays
        assert calls.log.count("pinned") == 2 * 2  # an upload and a download slot per frame in flight
        assert "sync" in calls.log  # each output waited for its own event


def test_frames_stay_in_flight_until_depth_then_come_out_in_order(comps):
    config = CONFIGS["1 step, no CFG"]
    images = frames(5)
    expected = eager_outputs(comps, config, images)
    stream = StreamDiffusion(comps, config, prompt="a red fox")
    graph = FrameGraph(stream, depth=3, graphs=True, calls=FakeCalls())
    assert graph.submit(images[0]) == [] and graph.submit(images[1]) == []  # two frames in flight
    out = graph.submit(images[2])  # the third pushes the first out
    assert len(out) == 1
    np.testing.assert_array_equal(out[0], expected[0])
    rest = graph.submit(images[3]) + graph.submit(images[4]) + graph.drain()
    for a, b in zip(expected[1:], rest):
        np.testing.assert_array_equal(a, b)
    assert graph(images[0]).shape == (64, 64, 3)  # one frame in, its own output out


def test_a_changed_setting_captures_again_with_the_eager_outputs(comps):
    config = CONFIGS["Stream Batch 2 steps, self CFG"]
    images = frames(8, seed=3)
    changes = {3: [lambda s: s.set_prompt("a blue whale")], 5: [lambda s: s.update(seed=7, guidance_scale=1.2)],
               6: [lambda s: s.update(steps=1)]}
    expected = eager_outputs(comps, config, images, changes)
    calls = FakeCalls()
    got, graph, _ = graph_outputs(comps, config, images, depth=2, calls=calls, changes=changes)
    for a, b in zip(expected, got):
        np.testing.assert_array_equal(a, b)
    assert graph.captures == 3  # the first, the seed and guidance, the steps (a prompt is copied in)


def test_a_prompt_that_moves_every_frame_is_copied_in_not_captured_again(comps):
    """A prompt schedule's transition blends two prompts with a new weight every frame."""
    config = CONFIGS["1 step, no CFG"]
    images = frames(5, seed=4)
    changes = {i: [lambda s, w=i / 4: s.set_prompt([("a red fox", 1 - w), ("a blue whale", w)])] for i in range(5)}
    expected = eager_outputs(comps, config, images, changes)
    got, graph, _ = graph_outputs(comps, config, images, depth=2, calls=FakeCalls(), changes=changes)
    for a, b in zip(expected, got):
        np.testing.assert_array_equal(a, b)
    assert graph.captures == 1 and graph.replays == 5


def test_frames_a_graph_cannot_hold_run_eagerly_in_order(comps):
    config = StreamDiffusionConfig(width=64, height=64, steps=1, strength=0.5, cfg_type="none", temporal="feedback")
    images = frames(4, seed=5)
    expected = eager_outputs(comps, config, images)
    got, graph, _ = graph_outputs(comps, config, images, depth=2, calls=FakeCalls())
    assert graph.replays == 0 and graph.captures == 0
    for a, b in zip(expected, got):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(StreamStudioError, match="at least 1"):
        FrameGraph(StreamDiffusion(comps, config), depth=0)


@pytest.mark.parametrize("faked_gpu", [False, True], ids=["cpu", "faked-gpu"])
@pytest.mark.parametrize("steps", [1, 2])
def test_the_similarity_filter_skips_the_same_frames_through_the_graph(comps, faked_gpu, steps):
    """Still stretches of a clip are skipped (their output repeats the last one), the same frames
    and the same outputs as the eager stream; on the GPU branch the comparison runs on the side
    stream and only a frame that goes through waits for it."""
    config = StreamDiffusionConfig(width=64, height=64, steps=steps, strength=0.6, cfg_type="self",
                                   guidance_scale=1.3, similarity_filter=True, similarity_threshold=0.9,
                                   max_skip_frame=3)
    a, b, c = frames(3, seed=8)
    images = [a, a, a, a, a, a, b, b, c, c, c, a]
    eager = StreamDiffusion(comps, config, prompt="a red fox")
    expected = [np.copy(eager(image)) for image in images]
    calls = FakeCalls() if faked_gpu else None
    got, graph, stream = graph_outputs(comps, config, images, depth=2, calls=calls)
    for x, y in zip(expected, got):
        np.testing.assert_array_equal(x, y)
    assert stream.stats.skipped == eager.stats.skipped > 0 and stream.stats.frames_in == len(images)
    assert stream.skip_rate == eager.skip_rate
    if faked_gpu:
        assert calls.log.count("wait side") == graph.replays  # each frame that went through, once


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["1 step, no CFG", "Stream Batch 2 steps, self CFG"])
def test_a_real_cuda_graph_gives_the_eager_streams_frames(tiny_components_factory, name):
    """On a GPU: the captured graph with two frames in flight, fp16, against the eager stream."""
    comps = tiny_components_factory().to(torch.device("cuda"), torch.float16)
    config = CONFIGS[name]
    images = frames(8, seed=11)
    expected = eager_outputs(comps, config, images)
    stream = StreamDiffusion(comps, config, prompt="a red fox")
    graph = FrameGraph(stream, depth=2)
    assert graph.graphs
    got = []
    for image in images:
        got += graph.submit(image)
    got += graph.drain()
    assert graph.captures == 1 and graph.replays == len(images) - (1 if stream.sampler.stream_batch else 0)
    for a, b in zip(expected, got):
        assert np.abs(a.astype(int) - b.astype(int)).max() <= 1  # the same kernels; a uint8 step at most


def test_render_frame_graph_builds_a_live_stream_one_frame_behind(capsys):
    """`--frame-graph` from the command line: the live processor hands back the newest finished
    output at once (one frame behind with 2 in flight on a GPU; on a CPU its own), equal to the
    plain stream's; serve and TensorRT refuse it with a clear error."""
    from streamstudio.app.cli import build_parser
    from streamstudio.app.cli.requests import image_request
    from streamstudio.app.streams.image import build_pipeline
    from streamstudio.pipelines.image.frame_graph import LiveGraphStream

    args = build_parser().parse_args(["render", "--input", "x.mp4", "--output", "y.mp4", "--model", "tiny",
                                      "--device", "cpu", "--frame-graph", "--width", "64", "--height", "64"])
    request = image_request(args)
    assert request.frame_graph
    live = build_pipeline(request, "img2img")
    plain = build_pipeline(image_request(build_parser().parse_args(
        ["render", "--input", "x.mp4", "--output", "y.mp4", "--model", "tiny", "--device", "cpu",
         "--width", "64", "--height", "64"])), "img2img")
    assert isinstance(live, LiveGraphStream) and live.config.width == 64  # the stream's attributes pass through
    for image in frames(3, seed=9):
        np.testing.assert_array_equal(live(image), plain(image))
    assert live.graph.replays >= 2
    from dataclasses import replace

    with pytest.raises(StreamStudioError, match="--frame-graph"):
        build_pipeline(replace(request, acceleration="tensorrt"), "img2img")
    with pytest.raises(StreamStudioError, match="not with serve"):
        build_pipeline(request, "img2img", serving=True)


@pytest.mark.gpu
def test_the_filter_on_a_real_side_stream_skips_what_the_eager_stream_skips(tiny_components_factory):
    comps = tiny_components_factory().to(torch.device("cuda"), torch.float16)
    config = StreamDiffusionConfig(width=64, height=64, steps=2, strength=0.6, cfg_type="self", guidance_scale=1.3,
                                   similarity_filter=True, similarity_threshold=0.9, max_skip_frame=3)
    a, b = frames(2, seed=8)
    images = [a, a, a, a, a, b, b, a, a]
    eager = StreamDiffusion(comps, config, prompt="a red fox")
    expected = [np.copy(eager(image)) for image in images]
    got, graph, stream = graph_outputs(comps, config, images, depth=2, calls=CudaCalls())
    assert stream.stats.skipped == eager.stats.skipped > 0 and graph.captures == 1
    for x, y in zip(expected, got):
        assert np.abs(x.astype(int) - y.astype(int)).max() <= 1
