"""The Wan 2.1 backbone path (models/video/wan.py): a tiny Wan pipeline folder built offline (tiny
WanTransformer3DModel, AutoencoderKLWan, UMT5EncoderModel and a word-level tokenizer), loaded as
a real checkpoint would be, through the buffer sampler, the codec and `render --pipeline video`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from streamstudio.app.cli.render import add_video_arguments
from streamstudio.app.cli.render_video import run_video_render
from streamstudio.app.streams.video import build_stream, load_video_model
from streamstudio.errors import ModelNotFoundError, StreamStudioError
from streamstudio.models.video import wan
from streamstudio.pipelines.video.stream_video import StreamBufferConfig, StreamSampler, VideoStream, StreamVideoConfig

WORDS = ["<pad>", "</s>", "<unk>", "a", "red", "blue", "circle", "square", "moving", "left", "right", "cat"]
LATENT_MEAN = [0.3, -0.5, 0.1, 1.2]  # the tiny VAE's config: what the codec must normalise with
LATENT_STD = [1.5, 0.5, 2.0, 0.8]


def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])  # as T5: EOS
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                   model_max_length=512)


def build_tiny_wan(root: Path, pipeline: str = "WanPipeline", transformer_kw: dict | None = None) -> Path:
    """A diffusers Wan pipeline folder of tiny random networks (the real layout: model_index.json,
    transformer/, vae/, text_encoder/, tokenizer/). The VAE keeps Wan's 8x spatial and 4x temporal
    compression (three downsamples, the last two temporal), with 4 latent channels."""
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(0)
    kw = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
              text_dim=16, freq_dim=32, ffn_dim=32, num_layers=2, rope_max_seq_len=32)
    WanTransformer3DModel(**{**kw, **(transformer_kw or {})}).save_pretrained(root / "transformer")
    AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                     temperal_downsample=[False, True, True], latents_mean=LATENT_MEAN,
                     latents_std=LATENT_STD).save_pretrained(root / "vae")
    encoder = UMT5EncoderModel(UMT5Config(vocab_size=len(WORDS), d_model=16, d_kv=8, d_ff=32, num_layers=1,
                                          num_heads=2, relative_attention_num_buckets=8))
    with torch.no_grad():  # larger weights, so prompts differ clearly after the final norm
        for p in encoder.parameters():
            p.normal_(0, 0.5)
    encoder.save_pretrained(root / "text_encoder")
    tiny_tokenizer().save_pretrained(root / "tokenizer")
    index = {"_class_name": pipeline, "_diffusers_version": "0.42.1",
             "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
             "text_encoder": ["transformers", "UMT5EncoderModel"], "tokenizer": ["transformers", "T5TokenizerFast"],
             "transformer": ["diffusers", "WanTransformer3DModel"], "vae": ["diffusers", "AutoencoderKLWan"]}
    (root / "model_index.json").write_text(json.dumps(index))
    return root


@pytest.fixture(scope="module")
def wan_dir(tmp_path_factory):
    return build_tiny_wan(tmp_path_factory.mktemp("wan") / "Wan2.1-tiny")


@pytest.fixture(scope="module")
def loaded(wan_dir):
    torch.set_num_threads(1)
    return wan.load_wan(str(wan_dir), "cpu")


def test_loads_a_wan_folder(wan_dir, loaded):
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from transformers import UMT5EncoderModel

    assert isinstance(loaded.transformer, WanTransformer3DModel) and isinstance(loaded.codec.vae, AutoencoderKLWan)
    assert isinstance(loaded.text_encoder.encoder, UMT5EncoderModel)
    assert (loaded.device.type, loaded.dtype, loaded.codec.dtype) == ("cpu", torch.float32, torch.float32)
    assert wan.default_dtype("cpu") == torch.float32 and wan.default_dtype("cuda") == torch.bfloat16
    assert (loaded.latent_channels, loaded.patch, loaded.codec.spatial, loaded.codec.temporal) == (4, (2, 2), 8, 4)
    assert loaded.latent_size(480, 832) == (60, 104)  # the 1.3B model's 480p: 60x104 latents
    assert loaded.latent_size(36, 30) == (4, 4)  # to the nearest patch (16 px)
    # which --model values are Wan checkpoints
    assert wan.is_wan_model(str(wan_dir)) and wan.is_wan_model(wan.WAN_1_3B) and wan.is_wan_model(wan.WAN_14B)
    assert not any(wan.is_wan_model(m) for m in (None, "", "stabilityai/sd-turbo", str(wan_dir / "model_index.json"),
                                                 str(wan_dir / "vae"), "/nowhere/Wan2.1"))
    bare = wan_dir.parent / "transformer-only"  # no model_index.json: the transformer's config says Wan
    (bare / "transformer").mkdir(parents=True, exist_ok=True)
    (bare / "transformer" / "config.json").write_text((wan_dir / "transformer" / "config.json").read_text())
    assert wan.pipeline_class(bare) == "WanPipeline"


def test_per_frame_timesteps(loaded):
    """Frame i's tokens get timestep (1 - t_i) * 1000; equal levels equal the transformer called
    with one scalar timestep; a frame at another level gets another output."""
    backbone = loaded.backbone()
    text = backbone.encode_text("a red circle")
    torch.manual_seed(1)
    x = torch.randn(1, 4, 4, 4, 4)  # (B, F, C, H, W): 4 frames of 2x2 tokens
    seen = []
    hook = loaded.transformer.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["timestep"].clone()),
                                                        with_kwargs=True)
    t = torch.tensor([[0.1, 0.25, 0.9, 0.5]])
    try:
        with torch.no_grad():
            mixed = backbone.velocity(x, t, text)
    finally:
        hook.remove()
    per_token = seen[0].view(1, 4, 4)  # (B, F, tokens)
    torch.testing.assert_close(per_token, ((1 - t) * 1000)[..., None].expand(1, 4, 4))
    with torch.no_grad():
        same = backbone.velocity(x, torch.full((1, 4), 0.25), text)
        ref = loaded.transformer(x.permute(0, 2, 1, 3, 4), timestep=torch.tensor([750.0]), encoder_hidden_states=text,
                                 return_dict=False)[0]
    torch.testing.assert_close(same, -ref.permute(0, 2, 1, 3, 4), rtol=1e-4, atol=1e-5)
    assert (mixed[:, 2] - same[:, 2]).abs().max() > 1e-4  # frame 2 at 0.9 instead of 0.25
    with pytest.raises(StreamStudioError, match="temporal patch of 1"):
        from diffusers import WanTransformer3DModel

        wan.WanBackbone(WanTransformer3DModel(patch_size=(2, 2, 2), num_attention_heads=1, attention_head_dim=8,
                                              in_channels=4, out_channels=4, text_dim=16, num_layers=1, ffn_dim=8,
                                              freq_dim=16), loaded.text_encoder)


def test_text_conditioning_through_umt5(wan_dir, loaded):
    """The embeddings are WanPipeline's own `_get_t5_prompt_embeds` (512 tokens, zero past the
    prompt's tokens); two prompts give two velocities; guidance mixes in the empty prompt's."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    enc = loaded.text_encoder
    red = enc("a  red circle ")  # cleaned like WanPipeline: 3 words + EOS = 4 tokens
    assert red.shape == (1, wan.MAX_TEXT_TOKENS, 16)
    assert red[0, :4].abs().sum(dim=1).min() > 0 and not red[0, 4:].any()
    pipe = WanPipeline(tokenizer=enc.tokenizer, text_encoder=enc.encoder, vae=loaded.codec.vae,
                       scheduler=FlowMatchEulerDiscreteScheduler(), transformer=loaded.transformer)
    ref = pipe._get_t5_prompt_embeds("a  red circle ", max_sequence_length=512, device=torch.device("cpu"))
    torch.testing.assert_close(red, ref)
    blue = enc("a blue square")
    assert (blue[0, :4] - red[0, :4]).abs().max() > 1e-3
    backbone = loaded.backbone()
    x, t = torch.randn(1, 2, 4, 4, 4), torch.tensor([[0.3, 0.6]])
    with torch.no_grad():
        v_red, v_blue = backbone.velocity(x, t, red), backbone.velocity(x, t, blue)
        v_empty = backbone.velocity(x, t, enc(""))
        guided = loaded.backbone(guidance=3.0)
        v_guided = guided.velocity(x, t, guided.encode_text("a red circle"))
    assert (v_red - v_blue).abs().max() > 1e-4
    torch.testing.assert_close(v_guided, v_empty + 3.0 * (v_red - v_empty), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("layout", [(2, 2, 1), (4, 1, 2)])
def test_buffer_layouts_through_the_wan_stream(loaded, layout):
    """Every frame entering after the start passes levels 0 .. T-1 once, one per call, and leaves
    at T; a stream's chunks decode to 1 + 4 (c - 1) frames (the first) and 4c (every later one)
    of 8x the latent size."""
    n, c, s = layout
    cfg = StreamBufferConfig(num_chunks=n, chunk_size=c, micro_steps=s, shift=3.0)
    sampler = StreamSampler(loaded.backbone(), cfg, (4, 4, 4), "a red circle")
    sampler.start()
    history: dict[int, list[int]] = {}
    left: list[int] = []
    with torch.no_grad():
        for _ in range(cfg.levels * 3):
            for i, level in zip(sampler.ids, sampler.levels.tolist()):
                history.setdefault(i, []).append(level)
            before = list(sampler.ids)
            done = sampler.step()
            if done is not None:
                assert done.shape == (c, 4, 4, 4) and torch.isfinite(done).all()
                left += before[:c]
    late = [i for i in left if i >= cfg.frames]  # entered at level 0 after the start
    assert late and all(history[i] == list(range(cfg.levels)) for i in late)
    assert left == sorted(left)

    stream = VideoStream(loaded.backbone(), StreamVideoConfig(cfg, height=4, width=4, decode_overlap=0), "a red cat",
                         codec=loaded.codec.stream(), latent_channels=4)
    with torch.no_grad():
        chunks = [stream.push(None) for _ in range(3)]
    assert [len(ch) for ch in chunks] == [1 + 4 * (c - 1), 4 * c, 4 * c]
    assert all(f.shape == (32, 32, 3) and f.dtype == np.uint8 for ch in chunks for f in ch)
    assert stream.flush() == []


def test_codec_round_trip_and_normalisation(loaded):
    """encode: 1 + 4k frames -> 1 + k latent frames, (mode - latents_mean) / latents_std of the
    VAE config; decode(encode(x)) is the VAE's own decode of its own encode; the stream codec's
    chunk-by-chunk decode equals one decode of all the chunks."""
    codec, vae = loaded.codec, loaded.codec.vae
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (9, 32, 32, 3), dtype=np.uint8)
    images = torch.from_numpy(frames).float().permute(0, 3, 1, 2) / 127.5 - 1  # (F, 3, H, W) in [-1, 1]
    z = codec.encode(images)
    assert z.shape == (3, 4, 4, 4)  # (1 + 8/4, C, 32/8, 32/8)
    x = images.permute(1, 0, 2, 3)[None]  # (1, 3, F, H, W): the VAE's own layout
    with torch.no_grad():
        mode = vae.encode(x).latent_dist.mode()  # (1, C, 3, 4, 4)
        own = vae.decode(mode).sample  # (1, 3, 9, 32, 32)
    mean = torch.tensor(LATENT_MEAN).view(1, 4, 1, 1, 1)
    std = torch.tensor(LATENT_STD).view(1, 4, 1, 1, 1)
    torch.testing.assert_close(z, ((mode - mean) / std)[0].permute(1, 0, 2, 3))
    back = codec.decode(z)
    assert back.shape == (9, 3, 32, 32) and codec.pixel_frames(3) == 9 and codec.latent_frames(9) == 3
    torch.testing.assert_close(back, own[0].permute(1, 0, 2, 3), rtol=1e-4, atol=1e-4)
    # streaming: chunks of 2, 1, 2 latent frames give 5, 4, 8 frames = one decode of all 5
    lat = torch.randn(5, 4, 4, 4)
    whole = codec.decode(lat)
    stream = codec.stream()
    parts = [stream.decode(lat[:2]), stream.decode(lat[2:3]), stream.decode(lat[3:])]
    assert [p.shape[0] for p in parts] == [5, 4, 8] and whole.shape[0] == 17 == codec.pixel_frames(5)
    torch.testing.assert_close(torch.cat(parts), whole, rtol=1e-4, atol=1e-5)
    stream.reset()
    torch.testing.assert_close(stream.decode(lat[:2]), whole[:5], rtol=1e-4, atol=1e-5)
    with pytest.raises(StreamStudioError, match="1 \\+ 4k frames"):
        codec.encode(images[:8])
    # streaming encode (a causal stream's video-to-video): 1 + 4, then 4 frames a call = one encode of all 9
    parts = [stream.encode(images[:5]), stream.encode(images[5:])]
    assert [p.shape[0] for p in parts] == [2, 1]
    torch.testing.assert_close(torch.cat(parts), z, rtol=1e-5, atol=1e-5)
    with pytest.raises(StreamStudioError, match="4k at a time"):
        stream.encode(images[:3])


def test_stream_codec_of_the_wan_2_2_vae_layout():
    """Wan 2.2's VAE layout (residual blocks, 2x2 pixel patches, 16x spatial compression): the
    chunk-by-chunk decode still equals one decode (its checkpoints are refused by the loader,
    the codec is not tied to Wan 2.1's VAE)."""
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=8, decoder_base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                           temperal_downsample=[False, True, True], is_residual=True, in_channels=12, out_channels=12,
                           patch_size=2, scale_factor_spatial=16, latents_mean=LATENT_MEAN, latents_std=LATENT_STD)
    codec = wan.WanCodec(vae)
    lat = torch.randn(4, 4, 2, 2)  # (n, C, h, w): 32x32 frames
    whole, stream = codec.decode(lat), codec.stream()
    parts = [stream.decode(lat[:1]), stream.decode(lat[1:])]
    assert whole.shape == (13, 3, 32, 32) and [p.shape[0] for p in parts] == [1, 12]
    torch.testing.assert_close(torch.cat(parts), whole, rtol=1e-4, atol=1e-5)


def make_args(tmp_path, **kw):
    parser = argparse.ArgumentParser()
    add_video_arguments(parser)
    args = parser.parse_args([])
    base = dict(prompt="a red circle moving left", input=None, output=str(tmp_path / "frames"), frames=6,
                seed=0, width=32, height=32, fps=8.0, model=None, max_frames=None, num_chunks=2, chunk_size=1,
                micro_steps=1, device="cpu", dtype=None)
    base.update(kw)
    for k, v in base.items():
        setattr(args, k, v)
    return args


def test_render_from_the_cli_entry(wan_dir, tmp_path, capsys):
    """`render --pipeline video --model WAN_FOLDER` renders text-to-video with the Wan backbone."""
    from PIL import Image

    assert run_video_render(make_args(tmp_path, model=str(wan_dir))) == 0
    pngs = sorted((tmp_path / "frames").glob("*.png"))
    assert len(pngs) == 6 and Image.open(pngs[0]).size == (32, 32)
    out = capsys.readouterr().out
    assert f"model {wan_dir}" in out and "wrote 6 frames" in out
    model, meta = load_video_model(str(wan_dir), "cpu")
    assert isinstance(model, wan.WanModel) and meta["wan"] and model.dtype == torch.float32
    stream = build_stream(model, meta, "a red cat")  # the Wan defaults: 480x832, guidance 5, N=4 c=2 s=2
    assert stream.out_size == (480, 832) and (stream.cfg.height, stream.cfg.width) == (60, 104)
    b = stream.cfg.buffer
    assert (b.num_chunks, b.chunk_size, b.micro_steps, b.shift) == (4, 2, 2, 3.0)
    assert stream.sampler.backbone.guidance == 5.0 and stream.cfg.decode_overlap == 0
    compiled = build_stream(model, meta, "a red cat", width=32, height=32, acceleration="compile")
    assert hasattr(compiled.sampler.backbone.transformer, "_orig_mod")


@pytest.mark.parametrize("name", ["wan", "builtin", "builtin-causal"])
def test_output_size_is_the_built_streams_without_building_one(name, wan_dir):
    """`video_output_size` (what `serve --live-pipeline video` sizes its streams by, since building a
    stream to learn its size allocates a causal model's KV cache) equals the built stream's size
    for each kind of model and each way of asking: the checkpoint's own, one side, both, an aspect."""
    from streamstudio.app.streams.video import video_output_size

    model, meta = load_video_model(str(wan_dir) if name == "wan" else name, "cpu")
    asks = [{}, {"width": 48}, {"height": 40}, {"width": 64, "height": 32}]
    if name != "wan":  # (a Wan checkpoint is text-to-video only: no input aspect)
        asks += [{"aspect": 16 / 9}, {"aspect": 0.75, "width": 96}]
    for ask in asks:
        stream = build_stream(model, meta, "a red circle", width=ask.get("width"), height=ask.get("height"),
                              aspect=ask.get("aspect"), strength=1.0)
        height, width = stream.out_size
        assert video_output_size(model, meta, ask.get("width"), ask.get("height"), ask.get("aspect")) == \
            (width, height), (name, ask)
    # the checkpoints' own sizes: 32x32 pixel grids x 8, Wan's 480x832 (docs/video.md)
    assert video_output_size(model, meta, None, None) == {"wan": (832, 480)}.get(name, (256, 256))


def test_errors_say_what_to_do(wan_dir, tmp_path, monkeypatch):
    model, meta = load_video_model(str(wan_dir), "cpu")
    with pytest.raises(StreamStudioError, match="text-to-video only"):
        build_stream(model, meta, "a red cat", strength=0.6)
    with pytest.raises(StreamStudioError, match="text-to-video only"):
        build_stream(model, meta, "a red cat", aspect=16 / 9)  # an --input's aspect: video-to-video
    with pytest.raises(StreamStudioError, match="--acceleration tensorrt"):
        build_stream(model, meta, "a red cat", acceleration="tensorrt")
    # a folder that is neither a StreamDiT checkpoint nor a Wan folder
    neither = tmp_path / "neither"
    neither.mkdir()
    (neither / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))
    with pytest.raises(ModelNotFoundError, match="train-video.*Wan2.1-T2V-1.3B-Diffusers"):
        run_video_render(make_args(tmp_path, model=str(neither)))
    # Wan image-to-video and Wan 2.2's two experts: named, refused
    i2v = tmp_path / "i2v"
    i2v.mkdir()
    for sub in ("transformer", "vae", "text_encoder", "tokenizer"):
        (i2v / sub).symlink_to(wan_dir / sub)
    (i2v / "model_index.json").write_text(json.dumps({"_class_name": "WanImageToVideoPipeline"}))
    with pytest.raises(StreamStudioError, match="WanImageToVideoPipeline.*text-to-video only"):
        load_video_model(str(i2v), "cpu")
    (i2v / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline", "boundary_ratio": 0.875,
                                                      "transformer_2": ["diffusers", "WanTransformer3DModel"]}))
    with pytest.raises(StreamStudioError, match="two expert transformers"):
        load_video_model(str(i2v), "cpu")
    (i2v / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline", "expand_timesteps": True}))
    with pytest.raises(StreamStudioError, match="TI2V"):
        load_video_model(str(i2v), "cpu")
    # a hub id with the hub off, and with the hub unreachable: how to get it
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="hf download Wan-AI/Wan2.1-T2V-1.3B-Diffusers"):
        load_video_model(wan.WAN_1_3B, "cpu")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    from streamstudio.models import hub

    monkeypatch.setattr(hub, "hub_download_size", lambda *a, **k: None)
    with pytest.raises(ModelNotFoundError, match="cannot be reached.*--local-dir DIR"):
        wan.load_wan("Wan-AI/Wan2.1-T2V-14B-Diffusers", "cpu")
    with pytest.raises(ModelNotFoundError, match="no such folder"):
        wan.load_wan(str(tmp_path / "nowhere"), "cpu")


def test_wan_1_3b_benchmark_row_shapes_on_meta():
    """The benchmark's Wan 2.1 1.3B row: the real config (about 1.4B parameters), one buffer call
    of N=4 c=2 (8 latent frames) at 480x832 = 60x104 latents, run on the meta device here."""
    import sys

    bench_dir = str(Path(__file__).resolve().parents[2] / "benchmarks")
    if bench_dir not in sys.path:
        sys.path.insert(0, bench_dir)
    import stream_video as bench
    from diffusers import WanTransformer3DModel

    assert bench.WAN_1_3B_LATENT == (1, 8, 16, 60, 104)
    assert "8 latent frames" in bench.WAN_LABEL and "60x104" in bench.WAN_LABEL
    with torch.device("meta"):
        transformer = WanTransformer3DModel(**bench.WAN21_1_3B_CONFIG)
    params = sum(p.numel() for p in transformer.parameters())
    assert 1.3e9 <= params <= 1.5e9
    backbone = wan.WanBackbone(transformer, lambda prompt: torch.empty(1, 512, 4096, device="meta"))
    with torch.no_grad():
        out = backbone.velocity(torch.empty(*bench.WAN_1_3B_LATENT, device="meta"), torch.rand(1, 8, device="meta"),
                       backbone.encode_text("a cat"))
    assert tuple(out.shape) == bench.WAN_1_3B_LATENT
    if not torch.cuda.is_available():
        row = bench.gpu_wan(1)
        assert row["step_ms"] is None and "missing" in bench.wan_text(row)
