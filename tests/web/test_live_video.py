"""Live streams on the video pipeline from their first frame (`serve --live-pipeline video`,
app/web/video_deck.py's `VideoLiveProcessor`): the built-in causal model plays a stream
video-to-video with no deck step, frame for frame what the causal stream alone makes of the same
frames; a txt2img stream is text-to-video; a WHIP publisher's stream reaches a WHEP viewer."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from helpers import feed_one, wait_for_sync
from live_server import SIZE, pattern, publisher_in_a_process, start, viewers_in_a_process

from streamstudio.app.cli import build_parser
from streamstudio.app.cli.serve_run import build_app
from streamstudio.app.streams.video import DEFAULT_STRENGTH, VideoFrames, build_stream
from streamstudio.app.web.video_deck import VideoLiveProcessor
from streamstudio.errors import StreamStudioError
from streamstudio.frames import fit_aspect

TOKEN = "live-video-token"


@pytest.fixture(scope="module")
def server():
    srv = start("--live-pipeline", "video", "--video-model", "builtin-causal", "--prompt", "a red circle moving left",
                "--whip-token", TOKEN, "--max-streams", "3")
    yield srv
    srv.close()


def reference(server, prompt: str, strength: float) -> VideoFrames:
    """The causal stream the server's model makes for a stream, built here alone."""
    model = server.manager.model
    stream = build_stream(model.network, model.meta, prompt, strength=strength, seed=model.config.seed,
                          width=SIZE, height=SIZE)
    return VideoFrames(stream)


def test_a_camera_stream_plays_the_causal_model_from_its_first_frame(server):
    session = server.manager.open("live-causal")
    outs = [feed_one(session, pattern(i)) for i in range(9)]
    processor = session.processor
    assert isinstance(processor, VideoLiveProcessor) and processor.ready
    latency = processor.pipe.latency_frames
    assert latency is not None and 0 < latency < 9 and session.stats()["frame_latency"] == latency
    ref, made = reference(server, "a red circle moving left", float(DEFAULT_STRENGTH)), []
    for i, out in enumerate(outs):
        assert out.shape == (SIZE, SIZE, 3)
        made += ref.push(pattern(i))
        if i < latency:
            assert not out.any(), f"frame {i}: black until the first chunk is out"
        else:
            np.testing.assert_array_equal(out, made[i - latency], err_msg=f"frame {i}")

    session.request({"prompt": "a blue square moving up"})
    feed_one(session, pattern(9))
    assert session.notice is None and session.stats()["settings"]["prompt"] == "a blue square moving up"
    session.request({"seed": 7})
    feed_one(session, pattern(10))
    assert "takes prompt, fit and strength only" in session.notice
    server.manager.close("live-causal")


def test_a_causal_stream_takes_its_strength_live(server):
    """The strength slider on a live causal stream: from the next chunk on, video-to-video starts from
    the input noised that far, its cache kept. Near 0 the output is the input again (what any SDEdit
    gives at a low level), where the table's 0.6 draws the model's own shapes over it."""
    session = server.manager.open("live-strength")

    def from_input(i: int, out: np.ndarray, latency: int) -> float:  # mean |output - its input|, 0-255
        card = Image.fromarray(fit_aspect(pattern(i - latency), SIZE, SIZE, "crop")).resize((SIZE, SIZE))
        return float(np.abs(out.astype(float) - np.asarray(card, float)).mean())

    outs = [feed_one(session, pattern(i)) for i in range(10)]
    latency = session.processor.pipe.latency_frames
    session.request({"strength": 0.05})
    outs += [feed_one(session, pattern(i)) for i in range(10, 20)]
    assert session.notice is None and session.processor.frames.stream.sampler.sigma == 0.05
    before = [from_input(i, outs[i], latency) for i in range(latency, 10)]
    after = [from_input(i, outs[i], latency) for i in range(10 + latency + 2, 20)]  # (after the next chunk)
    assert min(before) > 50 and max(after) < 25, (before, after)
    session.request({"strength": 1.0})  # text-to-video is another stream
    feed_one(session, pattern(20))
    assert "in (0, 1)" in session.notice
    server.manager.close("live-strength")


def test_a_txt2img_stream_is_text_to_video(server):
    session = server.manager.open("live-t2v", "txt2img")
    outs = [feed_one(session, None) for _ in range(6)]
    ref = reference(server, "a red circle moving left", 1.0)
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out, ref.push(None)[0], err_msg=f"frame {i}")
    assert any(out.max() > 100 for out in outs)  # the object, not a black wait
    session.request({"strength": 0.5})
    feed_one(session, None)
    assert "text-to-video" in session.notice  # (no input to noise)
    server.manager.close("live-t2v")


def test_a_whip_publisher_plays_the_causal_model_to_a_whep_viewer(server):
    publisher, line = publisher_in_a_process(f"{server.url}/whip/live-whip", TOKEN)
    viewers = None
    try:
        assert line.startswith("201 "), line
        session = lambda: server.manager.get("live-whip")  # noqa: E731
        assert wait_for_sync(lambda: session() is not None and session().processed >= 8, timeout=60)
        assert isinstance(session().processor, VideoLiveProcessor) and session().processor.ready
        assert wait_for_sync(lambda: session().latest() is not None and session().latest().max() > 100, timeout=30)
        viewers, lines = viewers_in_a_process(f"{server.url}/whep/live-whip", 1, TOKEN)
        assert lines == ["201 watching"], lines
    finally:
        publisher.kill()
        if viewers is not None:
            viewers.kill()


def test_live_video_runs_in_this_process_only():
    args = build_parser().parse_args(["serve", "--live-pipeline", "video", "--gpus", "2", "--device", "cpu"])
    with pytest.raises(StreamStudioError, match="--live-pipeline video"):
        build_app(args)
