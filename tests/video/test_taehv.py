"""TAEHV as the causal stream's video codec (issue 49): decode and encode equal madebyollin/taehv's
own taehv.py, whole and chunk by chunk, with shared random weights; the published state-dict
layout loads by name from .pth and .safetensors; clear errors without a weight file.

tests/video/fixtures/taehv_reference.pt was written by benchmarks/taehv_reference.py, which ran the
reference's TAEHV (Wan 2.1's layout, taew2_1) on CPU in float32 with `random_state(keys, seed)`
weights over the reference's own state-dict keys (recorded in the fixture, with the seed)."""

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from streamstudio.errors import ModelNotFoundError, StreamStudioError
from streamstudio.models.video.causal_backbone import CausalWanBackbone
from streamstudio.models.video.causal_wan import CausalWan, CausalWanConfig
from streamstudio.models.video.taehv import TAEHV, TAEHVCodec, load_taehv, model_for, random_state, run_blocks
from streamstudio.pipelines.video.causal_video import CausalConfig, CausalStreamConfig, CausalVideoStream

FIXTURE = Path(__file__).parent / "fixtures" / "taehv_reference.pt"
TOL = 1e-5  # float32 on CPU: the same convolutions, batched over time differently


@pytest.fixture(scope="module")
def case():
    return torch.load(FIXTURE, weights_only=False)


@pytest.fixture(scope="module")
def codec(case):
    return TAEHVCodec(model_for(random_state(case["keys"], case["seed"])), "cpu", torch.float32)


def close(ours: torch.Tensor, ref: torch.Tensor, tol: float = TOL) -> None:
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    err = float((ours - ref).abs().max())
    assert err < tol * max(1.0, float(ref.abs().max())), f"max error {err:.2e}"


def test_state_dict_keys_are_the_references(case):
    ours = {k: tuple(v.shape) for k, v in TAEHV().state_dict().items()}
    assert list(ours.items()) == list(case["keys"].items())


def test_decode_equals_the_reference(case, codec):
    raw, _ = run_blocks(codec.model.decoder, case["latents"], [None] * len(codec.model.decoder))
    close(raw, case["raw"])  # untrimmed and unclamped: (4n, 3, H, W)
    out = codec.decode(case["latents"])  # [-1, 1]; the reference's [0, 1]
    assert out.shape[0] == codec.pixel_frames(case["latents"].shape[0]) == 1 + 4 * (case["latents"].shape[0] - 1)
    close(out, case["decoded"] * 2 - 1)


@pytest.mark.parametrize("chunks", [(2, 2, 2), (1, 3, 2), (1, 1, 1, 1, 1, 1)])
def test_chunk_by_chunk_decode_equals_decoding_at_once(case, codec, chunks):
    stream, latents, outs, i = codec.stream(), case["latents"], [], 0
    for c in chunks:
        outs.append(stream.decode(latents[i:i + c]))
        assert outs[-1].shape[0] == (1 + 4 * (c - 1) if i == 0 else 4 * c)  # as wan.WanStreamCodec
        i += c
    whole = torch.cat(outs)
    close(whole, case["decoded"] * 2 - 1)
    close(whole, case["stream"] * 2 - 1)  # the reference's StreamingTAEHV, frame by frame
    stream.reset()
    close(stream.decode(latents[:2]), case["decoded"][:5] * 2 - 1)  # a new video


def test_encode_equals_the_reference(case, codec):
    images = case["images"] * 2 - 1
    close(codec.encode(images), case["encoded"])
    assert codec.encode(images[:5]).shape[0] == 2  # 1 + 4k frames: 1 + k latent frames, as Wan's VAE


def test_chunk_by_chunk_encode(case, codec):
    """Chunk k's latents are the reference's encoding of every frame up to chunk k's end, its last c
    latent frames; all but each chunk's last (made with the chunk's last frame repeated ahead)
    equal encoding the whole video at once."""
    images, c, stream = case["images"] * 2 - 1, case["chunk"], codec.stream()
    start, outs = 0, []
    for end, prefix in zip(case["prefix_ends"], case["prefixes"]):
        outs.append(stream.encode(images[start:end]))
        assert outs[-1].shape[0] == c
        close(outs[-1], prefix[-c:])
        start = end
    whole = torch.cat(outs)
    exact = [i for i in range(whole.shape[0]) if (i + 1) % c]
    close(whole[exact], case["encoded"][exact])
    close(whole[-1], case["encoded"][-1])  # the video's end: padded in both


def test_odd_chunks_encode_one_latent_a_group(case, codec):
    images, stream = case["images"] * 2 - 1, codec.stream()
    outs = [stream.encode(images[a:b]) for a, b in [(0, 2), (2, 3), (3, 9), (9, 10), (10, 21)]]
    assert [o.shape[0] for o in outs] == [1, 0, 2, 0, 3]  # ceil(frames / 4) latent frames so far
    close(torch.cat(outs)[-1], case["encoded"][-1])
    assert stream.encoded == 21


def test_weight_files_load_by_name(case, tmp_path):
    state = random_state(case["keys"], case["seed"])
    torch.save(state, tmp_path / "taew2_1.pth")
    save_file({k: v.half() for k, v in state.items()}, str(tmp_path / "taew2_1.safetensors"))  # published: fp16
    latents = case["latents"][:2]
    ref = TAEHVCodec(model_for(state), "cpu", torch.float32).decode(latents)
    close(load_taehv(tmp_path / "taew2_1.pth", "cpu").decode(latents), ref)
    half = load_taehv(tmp_path / "taew2_1.safetensors", "cpu", torch.float32)
    assert half.spatial == 8 and half.channels == 16 and half.dtype == torch.float32
    close(half.decode(latents), ref, 1e-2)


def test_missing_or_foreign_files_say_where_to_get_taehv(tmp_path):
    with pytest.raises(ModelNotFoundError, match="github.com/madebyollin/taehv"):
        load_taehv(tmp_path / "taew2_1.pth")
    torch.save({"conv.weight": torch.zeros(1)}, tmp_path / "other.pth")
    with pytest.raises(StreamStudioError, match="not TAEHV weights"):
        load_taehv(tmp_path / "other.pth")
    state = TAEHV().state_dict()
    state["decoder.3.conv.0.weight"] = torch.zeros(1)
    with pytest.raises(StreamStudioError, match="do not fit"):
        model_for(state)


def test_the_causal_stream_runs_on_taehv(case, codec):
    """CausalVideoStream over the TAEHV stream codec: 16 latent channels, 4 frames a latent frame;
    a chunk of 2 latent frames takes 1 + 4 frames first, then 8, and gives as many back."""
    torch.manual_seed(0)
    model = CausalWan(CausalWanConfig(dim=32, ffn_dim=64, freq_dim=16, text_dim=8, text_len=8, in_dim=16, out_dim=16,
                                      num_heads=2, num_layers=1)).eval()

    def text(prompt: str) -> torch.Tensor:
        return torch.ones(1, 3, 8)

    cfg = CausalStreamConfig(CausalConfig(chunk_frames=2, window=6, sink=0, steps=(1000.0, 500.0), strength=0.7),
                             height=2, width=2, temporal=codec.temporal)
    stream = CausalVideoStream(CausalWanBackbone(model, text), cfg, "x", codec=codec.stream())
    outs = [stream.push(np.full((16, 16, 3), 10 * i, np.uint8)) for i in range(13)]
    assert [len(o) for o in outs][4] == 5 and len(outs[12]) == 8 and sum(len(o) for o in outs) == 13
    assert outs[4][0].shape == (16, 16, 3)


def test_load_released_takes_taehv(case, tmp_path, monkeypatch):
    """load_released(..., taehv=FILE): the generator with the base's text encoder and TAEHV as its
    codec (the Wan base's loader and the 1.3B size check stubbed: a tiny generator)."""
    from types import SimpleNamespace

    from streamstudio.models.video import causal_checkpoint as cc
    from streamstudio.models.video.taehv import TAEHVStreamCodec

    tiny = CausalWanConfig(dim=32, ffn_dim=64, freq_dim=16, text_dim=8, text_len=8, in_dim=16, out_dim=16,
                           num_heads=2, num_layers=1)
    torch.save({"generator_ema": {f"model.{k}": v for k, v in CausalWan(tiny).state_dict().items()}},
               tmp_path / "self_forcing_dmd.pt")
    torch.save(random_state(case["keys"], case["seed"]), tmp_path / "taew2_1.pth")
    monkeypatch.setattr(cc, "config_for", lambda state: tiny)
    wan_codec = SimpleNamespace(temporal=4, stream=lambda: "the Wan VAE")
    monkeypatch.setattr(cc.wan, "load_wan_pieces", lambda *a, **k: SimpleNamespace(codec=wan_codec,
                                                                                    text_encoder=len))
    loaded = cc.load_released(str(tmp_path / "self_forcing_dmd.pt"), None, "cpu", torch.float32,
                              taehv=tmp_path / "taew2_1.pth")
    assert isinstance(loaded.codec, TAEHVStreamCodec) and loaded.temporal == 4 and loaded.family == "self_forcing"
    assert cc.load_released(str(tmp_path / "self_forcing_dmd.pt"), None, "cpu", torch.float32).codec == "the Wan VAE"
    with pytest.raises(ModelNotFoundError, match="madebyollin/taehv"):  # before the generator loads
        cc.load_released("no-such-generator.pt", None, "cpu", torch.float32, taehv=tmp_path / "missing.pth")


def test_render_flags_name_taehv(tmp_path):
    from argparse import Namespace

    from streamstudio.app.cli.render_video import taehv_file
    from streamstudio.app.streams.video import load_video_model

    assert taehv_file(Namespace(video_decoder="wan", taehv=None)) is None
    assert taehv_file(Namespace(video_decoder="taehv", taehv="t.pth")) == "t.pth"
    with pytest.raises(StreamStudioError, match="needs --taehv FILE.*github.com/madebyollin/taehv"):
        taehv_file(Namespace(video_decoder="taehv", taehv=None))
    with pytest.raises(StreamStudioError, match="add --video-decoder taehv"):
        taehv_file(Namespace(video_decoder="wan", taehv="t.pth"))
    with pytest.raises(StreamStudioError, match="pixel-space"):
        load_video_model("builtin-causal", "cpu", taehv="t.pth")
    with pytest.raises(StreamStudioError, match="released"):
        load_video_model(None, "cpu", taehv="t.pth")
