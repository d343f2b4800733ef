"""LoRAs at run time (models/image/lora.py): a LoRA written by the test with peft on the tiny model,
checked against the peft model it was made from."""

from __future__ import annotations

import copy

import pytest
import torch

from addon_models import make_lora

from streamstudio.errors import StreamStudioError
from streamstudio.models.image.lora import LoraSet, LoraSpec, parse_lora

def inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 4, 8, 8, generator=g)  # (B, 4, h, w)
    t = torch.tensor([999, 500])
    text = torch.randn(2, 7, 32, generator=g)  # (B, L, D)
    return x, t, text


def unet_out(unet, seed=1):
    x, t, text = inputs(seed)
    with torch.no_grad():
        return unet(x, t, encoder_hidden_states=text).sample


def text_out(comps):
    ids = comps.tokenizer(["a red house"], padding="max_length", max_length=16, truncation=True,
                          return_tensors="pt").input_ids
    with torch.no_grad():
        return comps.text_encoder(ids)[0]


@pytest.fixture
def comps(tiny_components_factory):
    return tiny_components_factory()


@pytest.mark.parametrize("text,source,scale", [
    ("style.safetensors", "style.safetensors", 1.0), ("style.safetensors:0.7", "style.safetensors", 0.7),
    ("/a/b:c/style:-1.5", "/a/b:c/style", -1.5), ("org/lora", "org/lora", 1.0),
    ("C:/x/y.safetensors", "C:/x/y.safetensors", 1.0)])
def test_parse_lora(text, source, scale):
    assert parse_lora(text) == LoraSpec(source, scale)


def test_parse_lora_bad_scale():
    with pytest.raises(StreamStudioError, match="scale"):
        parse_lora("style.safetensors:1e9")
    with pytest.raises(StreamStudioError, match="path or hub id"):
        parse_lora(":0.5")


@pytest.mark.parametrize("fuse", [True, False])
def test_lora_equals_its_peft_model_and_removal_restores_base(comps, tmp_path, fuse):
    ref_unet, _ = make_lora(comps, tmp_path)
    base_state = {k: v.clone() for k, v in comps.unet.state_dict().items()}
    base = unet_out(comps.unet)
    loras = LoraSet(comps, fuse=fuse)
    loras.add(str(tmp_path / "pytorch_lora_weights.safetensors"))
    with_lora = unet_out(comps.unet)
    assert (with_lora - base).abs().max() > 1e-2  # the LoRA changes the output
    torch.testing.assert_close(with_lora, unet_out(ref_unet), atol=2e-5, rtol=1e-4)  # as the model it came from

    loras.set_scale("pytorch_lora_weights", 0.5)
    ref_unet.set_adapters(["default"], [0.5])
    torch.testing.assert_close(unet_out(comps.unet), unet_out(ref_unet), atol=2e-5, rtol=1e-4)

    loras.set_scale("pytorch_lora_weights", 0.0)
    assert torch.equal(unet_out(comps.unet), base)  # scale 0 is the base model, exactly

    loras.set_scale("pytorch_lora_weights", 1.0)
    loras.remove(str(tmp_path / "pytorch_lora_weights.safetensors"))
    assert torch.equal(unet_out(comps.unet), base)  # removed: the base model, bit for bit
    state = comps.unet.state_dict()
    assert state.keys() == base_state.keys() and all(torch.equal(state[k], base_state[k]) for k in state)
    assert loras.listing() == [] and loras.version == 5  # add, three scales, remove


def test_fused_equals_unfused_and_scale_changes_do_not_drift(comps, tiny_components_factory, tmp_path):
    make_lora(comps, tmp_path / "a", seed=0)
    make_lora(comps, tmp_path / "b", seed=1)
    other = tiny_components_factory()
    fused, unfused = LoraSet(comps, fuse=True), LoraSet(other, fuse=False)
    for loras in (fused, unfused):
        loras.add(f"{tmp_path / 'a'}:0.8")
        loras.add(f"{tmp_path / 'b'}:-0.6")
    torch.testing.assert_close(unet_out(comps.unet), unet_out(other.unet), atol=2e-5, rtol=1e-4)
    assert fused.listing() == [(str(tmp_path / "a"), 0.8), (str(tmp_path / "b"), -0.6)]
    first = unet_out(comps.unet)
    for step in range(20):  # a slider dragged back and forth: the weights come back exactly each time
        fused.set_scale("b", -0.6 + 0.05 * (step % 5 + 1))
    fused.set_scale("b", -0.6)
    assert torch.equal(unet_out(comps.unet), first)
    fused.remove("a")
    unfused.remove(str(tmp_path / "a"))
    torch.testing.assert_close(unet_out(comps.unet), unet_out(other.unet), atol=2e-5, rtol=1e-4)
    assert "b" in fused.identity() and "a*" not in fused.identity() and unfused.identity() == ""


def test_text_encoder_lora_changes_embeddings_and_says_so(comps, tmp_path):
    _, ref_text = make_lora(comps, tmp_path, text=True, file_name="with_text.safetensors")
    base = text_out(comps)
    loras = LoraSet(comps)
    lora = loras.add(str(tmp_path / "with_text.safetensors"))
    assert lora.touches_text and loras.text_version == 1
    assert (text_out(comps) - base).abs().max() > 1e-3
    ids = comps.tokenizer(["a red house"], padding="max_length", max_length=16, return_tensors="pt").input_ids
    with torch.no_grad():
        torch.testing.assert_close(text_out(comps), ref_text(ids)[0], atol=2e-5, rtol=1e-4)
    loras.remove(lora.name)
    assert torch.equal(text_out(comps), base) and loras.text_version == 2


def test_lora_errors(comps, tmp_path):
    loras = LoraSet(comps, local_files_only=True)
    with pytest.raises(StreamStudioError, match="could not be loaded"):
        loras.add(str(tmp_path / "missing.safetensors"))
    (tmp_path / "x.bin").write_bytes(b"\0" * 16)
    with pytest.raises(StreamStudioError, match="only"):
        loras.add(str(tmp_path / "x.bin"))
    with pytest.raises(StreamStudioError, match="no LoRA"):
        loras.set_scale("nothing", 1.0)
    # a LoRA for other layers than this UNet has (here: a different width) is refused and leaves nothing behind
    from diffusers import UNet2DConditionModel
    from streamstudio.models.image import tiny

    other = copy.copy(comps)
    other.unet = UNet2DConditionModel(**{**tiny.UNET_CONFIG, "block_out_channels": (16, 32), "norm_num_groups": 4})
    make_lora(other, tmp_path / "wrong")
    base = unet_out(comps.unet)
    with pytest.raises(StreamStudioError):
        loras.add(str(tmp_path / "wrong"))
    assert loras.listing() == [] and torch.equal(unet_out(comps.unet), base)


def test_engine_cache_identity_follows_the_fused_loras(comps, tmp_path):
    """A TensorRT engine holds the weights: its cache key (the UNet's model_identity) changes with a
    fused LoRA and its scale, so a change rebuilds instead of loading a stale engine, and comes back
    when the LoRA is removed (the base engine is found again)."""
    from streamstudio.kernels.tensorrt.cache import model_identity

    make_lora(comps, tmp_path)
    base = model_identity(comps.unet)
    loras = LoraSet(comps)
    loras.add(str(tmp_path))
    with_lora = model_identity(comps.unet)
    loras.set_scale(loras.loras[0].name, 0.5)
    assert len({base, with_lora, model_identity(comps.unet)}) == 3
    loras.clear()
    assert model_identity(comps.unet) == base


def test_generate_with_lora_flag(tmp_path, capsys, tiny_components_factory):
    """--lora on the shared pipeline flags: generate's images change with it, and a missing LoRA is
    a clear error."""
    import numpy as np
    from PIL import Image

    from streamstudio.app.cli import main

    make_lora(tiny_components_factory(), tmp_path / "lora")
    outs = {}
    for name, extra in (("base", []), ("lora", ["--lora", f"{tmp_path / 'lora'}:1.5"])):
        rc = main(["generate", "--model", "tiny", "--prompt", "a cat", "--output", str(tmp_path / name),
                   "--num-images", "1", "--steps", "1", "--width", "32", "--height", "32", *extra])
        assert rc == 0
        outs[name] = np.asarray(Image.open(sorted((tmp_path / name).glob("*.png"))[0])).astype(int)
    assert np.abs(outs["base"] - outs["lora"]).max() > 0
    assert "LoRA: " in capsys.readouterr().out
    assert main(["generate", "--model", "tiny", "--output", str(tmp_path / "x"), "--lora",
                 str(tmp_path / "missing.safetensors")]) == 1
    assert "could not be loaded" in capsys.readouterr().err


def test_stream_update_lora_scale_reencodes_prompts(comps, tiny_components_factory, tmp_path):
    """A stream's update(lora_scales=...) rescales a LoRA without reloading anything; a LoRA with
    text-encoder weights makes the stream encode its prompts again: at scale 0 the stream's
    output is the base model's exactly."""
    import numpy as np

    from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion, StreamDiffusionConfig

    make_lora(comps, tmp_path, text=True, file_name="t.safetensors")
    frames = [np.random.default_rng(i).integers(0, 256, (32, 32, 3), dtype=np.uint8) for i in range(3)]
    config = StreamDiffusionConfig(width=32, height=32, steps=2, strength=0.7)

    def run(pipe):
        return [o for f in frames for o in pipe.push(f)] + pipe.flush()

    base = run(StreamDiffusion(tiny_components_factory(), config, prompt="a fox"))
    comps.loras = LoraSet(comps)
    lora = comps.loras.add(str(tmp_path / "t.safetensors"))
    pipe = StreamDiffusion(comps, config, prompt="a fox")
    assert any(not np.array_equal(a, b) for a, b in zip(base, run(pipe)))
    encodes = pipe.stats.text_encodes
    pipe.update(lora_scales={lora.name: 0.0})
    assert pipe.stats.text_encodes > encodes  # the prompts went through the changed text encoder again
    assert all(np.array_equal(a, b) for a, b in zip(base, run(pipe)))


def test_the_page_lists_the_loaded_loras_with_their_scales(comps, tmp_path):
    from streamstudio.app.web.sessions import ServerModel, SessionManager
    from streamstudio.app.web.ui import model_banner
    from streamstudio.pipelines.image.stream_diffusion import StreamDiffusionConfig

    make_lora(comps, tmp_path / "style")
    comps.loras = LoraSet(comps)
    comps.loras.add(f"{tmp_path / 'style'}:0.7")
    manager = SessionManager(ServerModel(comps, StreamDiffusionConfig(width=32, height=32), prompt="a cat"),
                             max_streams=1, owns_model=True)
    try:
        assert f"LoRA `{tmp_path / 'style'}` × 0.7" in model_banner(manager)
        comps.loras.set_scale("style", 0.25)
        assert "× 0.25" in model_banner(manager)
    finally:
        manager.shutdown()
