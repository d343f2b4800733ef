"""SDXL family (models/image/sdxl.py, models/image/loading.py): a tiny SDXL-architecture model saved with
save_pretrained and as one .safetensors, its conditioning against diffusers' own SDXL pipeline,
the SDXL choices of the loader (LCM-LoRA SDXL, TAESDXL, fp16-fix VAE) with tiny stand-ins."""

from __future__ import annotations

import copy

import pytest
import torch

from streamstudio.errors import ModelNotFoundError
from streamstudio.models.image import loading
from streamstudio.models.image import sdxl
from streamstudio.models.image.loading import load_components, save_single_file
from streamstudio.models.image.lora import LoraSet


@pytest.fixture(scope="module")
def tiny_xl():
    return load_components("tiny-sdxl")


def diffusers_pipe(comps):
    from diffusers import LCMScheduler, StableDiffusionXLPipeline

    return StableDiffusionXLPipeline(vae=comps.vae, text_encoder=comps.text_encoder,
                                     text_encoder_2=comps.text_encoder_2, tokenizer=comps.tokenizer,
                                     tokenizer_2=comps.tokenizer_2, unet=comps.unet,
                                     scheduler=LCMScheduler.from_config(comps.scheduler_config))


def assert_same_weights(a, b):
    for name in ("unet", "vae", "text_encoder", "text_encoder_2"):
        sa, sb = getattr(a, name).state_dict(), getattr(b, name).state_dict()
        assert sa.keys() == sb.keys(), name
        assert all(torch.equal(sa[k], sb[k]) for k in sa), name


def unet_eps(comps, prompt="a red house", size=64):
    text = sdxl.encode_prompts([prompt], [comps.tokenizer, comps.tokenizer_2],
                               [comps.text_encoder, comps.text_encoder_2], torch.device("cpu"), torch.float32)
    x = torch.randn(1, 4, size // 8, size // 8, generator=torch.Generator().manual_seed(0))  # (1, 4, h, w)
    ids = sdxl.time_ids(size, size, 1, torch.device("cpu"), torch.float32)
    with torch.no_grad():
        return comps.unet(x, torch.tensor([500]), encoder_hidden_states=text.embeds,
                          added_cond_kwargs=dict(text_embeds=text.pooled, time_ids=ids)).sample


def test_tiny_sdxl_is_sdxl(tiny_xl):
    assert tiny_xl.is_sdxl and tiny_xl.is_demo and tiny_xl.default_size == 64
    assert not load_components("tiny").is_sdxl
    assert_same_weights(tiny_xl, load_components("tiny-sdxl"))  # deterministic


def test_prompt_encoding_and_time_ids_equal_diffusers(tiny_xl):
    pipe = diffusers_pipe(tiny_xl)
    prompts = ["a red house", "blue sky over a field"]
    embeds, negative, pooled, negative_pooled = pipe.encode_prompt(prompts, device=torch.device("cpu"),
                                                                   do_classifier_free_guidance=True)
    ours = sdxl.encode_prompts(prompts, [tiny_xl.tokenizer, tiny_xl.tokenizer_2],
                               [tiny_xl.text_encoder, tiny_xl.text_encoder_2], torch.device("cpu"), torch.float32)
    assert ours.embeds.shape == (2, 77, 64) and ours.pooled.shape == (2, 32)
    assert torch.equal(ours.embeds, embeds) and torch.equal(ours.pooled, pooled)
    zeros = sdxl.zeros_like(ours)  # force_zeros_for_empty_prompt: the empty negative prompt is zeros
    assert torch.equal(zeros.embeds, negative) and torch.equal(zeros.pooled, negative_pooled)
    ids = pipe._get_add_time_ids((96, 128), (0, 0), (96, 128), torch.float32, text_encoder_projection_dim=32)
    assert torch.equal(sdxl.time_ids(96, 128, 3, torch.device("cpu"), torch.float32), ids.expand(3, 6))


def test_save_pretrained_pipeline_folder_loads_as_sdxl(tiny_xl, tmp_path):
    diffusers_pipe(tiny_xl).save_pretrained(tmp_path / "xl")
    loaded = load_components(str(tmp_path / "xl"), lcm_lora=None)
    assert loaded.is_sdxl and loaded.default_size == 1024
    assert_same_weights(tiny_xl, loaded)
    assert torch.equal(unet_eps(loaded), unet_eps(tiny_xl))
    assert sdxl.default_size("stabilityai/sdxl-turbo") == 512


def test_single_safetensors_roundtrip(tiny_xl, tmp_path):
    path = save_single_file(tiny_xl, tmp_path / "xl.safetensors")
    loaded = load_components(str(path))
    assert loaded.is_sdxl and loaded.is_demo and loaded.default_size == 64
    assert_same_weights(tiny_xl, loaded)
    assert loaded.tokenizer_2("a house").input_ids == tiny_xl.tokenizer_2("a house").input_ids
    assert torch.equal(unet_eps(loaded), unet_eps(tiny_xl))


def test_original_sdxl_single_file_is_recognised(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "sdxl_original.safetensors"
    save_file({loading.SDXL_ORIGINAL_KEY: torch.ones(4),
               "model.diffusion_model.input_blocks.0.0.weight": torch.ones(1)},
              str(path))
    assert loading.is_original_sdxl_file(path)
    # offline, diffusers' single-file loader cannot fetch SDXL's config: a clear error naming the file
    with pytest.raises(ModelNotFoundError, match="single-file loader"):
        load_components(str(path), local_files_only=True)


def sdxl_lora(comps, folder, seed=0):
    """A random SDXL LoRA over the UNet and both text encoders (diffusers layout, .safetensors)."""
    from diffusers import StableDiffusionXLPipeline
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    parts = {name: copy.deepcopy(getattr(comps, name)) for name in ("unet", "text_encoder", "text_encoder_2")}
    torch.manual_seed(seed)
    targets = {"unet": ["to_q", "to_k", "to_v", "to_out.0"], "text_encoder": ["q_proj", "v_proj"],
               "text_encoder_2": ["q_proj", "v_proj"]}
    for name, module in parts.items():
        module.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=targets[name], init_lora_weights=False))
    StableDiffusionXLPipeline.save_lora_weights(
        folder, **{f"{name}_lora_layers": get_peft_model_state_dict(m) for name, m in parts.items()},
        **{f"{name}_lora_adapter_metadata": m.peft_config["default"].to_dict() for name, m in parts.items()})
    return parts


def test_lora_on_sdxl(tmp_path):
    comps = load_components("tiny-sdxl")
    ref = sdxl_lora(comps, tmp_path / "lora")
    base = unet_eps(comps)
    loras = LoraSet(comps)
    lora = loras.add(str(tmp_path / "lora"))
    assert lora.touches_text
    ref_comps = copy.copy(comps)
    ref_comps.unet, ref_comps.text_encoder, ref_comps.text_encoder_2 = (ref["unet"], ref["text_encoder"],
                                                                        ref["text_encoder_2"])
    changed = unet_eps(comps)
    assert (changed - base).abs().max() > 1e-2
    torch.testing.assert_close(changed, unet_eps(ref_comps), atol=2e-5, rtol=1e-4)
    loras.remove(lora.name)
    assert torch.equal(unet_eps(comps), base)


def test_sdxl_consistency_lora_fused_by_the_loader(tiny_xl, tmp_path):
    diffusers_pipe(tiny_xl).save_pretrained(tmp_path / "xl")
    sdxl_lora(tiny_xl, tmp_path / "lcm")  # a stand-in for latent-consistency/lcm-lora-sdxl
    fused = load_components(str(tmp_path / "xl"), lcm_lora=str(tmp_path / "lcm"))
    assert any("LCM-LoRA fused" in n for n in fused.notes) and fused.step_type == "lcm"
    assert (unet_eps(fused) - unet_eps(tiny_xl)).abs().max() > 1e-2
    # auto picks the SDXL LCM-LoRA for a non-turbo SDXL model; offline it is named in the error
    with pytest.raises(ModelNotFoundError, match="lcm-lora-sdxl"):
        load_components(str(tmp_path / "xl"), local_files_only=True)


def test_taesdxl_and_fp16_vae_choices(tiny_xl, tmp_path, monkeypatch):
    from diffusers import AutoencoderKL, AutoencoderTiny

    diffusers_pipe(tiny_xl).save_pretrained(tmp_path / "xl")
    with pytest.raises(ModelNotFoundError, match="taesdxl"):
        load_components(str(tmp_path / "xl"), lcm_lora=None, taesd=True, local_files_only=True)
    AutoencoderTiny(**{**__import__("streamstudio.models.image.tiny", fromlist=["x"]).TAESD_CONFIG}).save_pretrained(
        tmp_path / "taesdxl")
    fast = load_components(str(tmp_path / "xl"), lcm_lora=None, taesd=str(tmp_path / "taesdxl"))
    assert isinstance(fast.vae, AutoencoderTiny) and "fast VAE: TAESDXL" in fast.notes

    # float16 without the fp16-fix VAE at hand: the model's VAE stays in float32
    half = load_components(str(tmp_path / "xl"), lcm_lora=None, dtype=torch.float16, local_files_only=True)
    assert half.vae_upcast and next(half.vae.parameters()).dtype == torch.float32
    assert next(half.unet.parameters()).dtype == torch.float16 and any("sdxl-vae-fp16-fix" in n for n in half.notes)
    # with it (a tiny stand-in folder): swapped in, in float16
    AutoencoderKL(**__import__("streamstudio.models.image.tiny", fromlist=["x"]).VAE_CONFIG,
                  force_upcast=False).save_pretrained(tmp_path / "fp16fix")
    monkeypatch.setattr(sdxl, "VAE_FP16_FIX", str(tmp_path / "fp16fix"))
    fixed = load_components(str(tmp_path / "xl"), lcm_lora=None, dtype=torch.float16, local_files_only=True)
    assert not fixed.vae_upcast and next(fixed.vae.parameters()).dtype == torch.float16
    assert not fixed.vae.config.force_upcast


def test_generate_runs_an_sdxl_model(tmp_path):
    import numpy as np
    from PIL import Image

    from streamstudio.app.cli import main

    assert main(["generate", "--model", "tiny-sdxl", "--prompt", "a cat", "--output", str(tmp_path),
                 "--num-images", "2", "--width", "48", "--height", "32"]) == 0
    images = [np.asarray(Image.open(f)) for f in sorted(tmp_path.glob("*.png"))]
    assert len(images) == 2 and images[0].shape == (32, 48, 3) and not np.array_equal(images[0], images[1])


# ------------------------------------------------------------------ SDXL through the stream pipeline
def stream(comps, **kw):
    from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion, StreamDiffusionConfig

    kw = {"width": 32, "height": 32, "steps": 3, "strength": 0.7, **kw}
    return StreamDiffusion(comps, StreamDiffusionConfig(**kw), prompt="a red fox", negative_prompt=kw.pop("neg", ""))


@pytest.mark.parametrize("cfg", ["none", "self", "full"])
def test_sdxl_stream_batch_equals_sequential(tiny_xl, cfg):
    import numpy as np
    from helpers import capture_latents

    inputs = [np.random.default_rng(i).integers(0, 256, (32, 32, 3), dtype=np.uint8) for i in range(5)]
    kw = dict(cfg_type=cfg, guidance_scale=1.5)
    batch, seq = stream(tiny_xl, **kw), stream(tiny_xl, use_denoising_batch=False, **kw)
    lat_b, lat_s = capture_latents(batch), capture_latents(seq)
    for pipe in (batch, seq):
        for image in inputs:
            pipe.push(image)
        pipe.flush()
    assert len(lat_b) == len(lat_s) == len(inputs)
    for a, b in zip(lat_b, lat_s):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(lat_b[0], lat_b[-1])


def test_sdxl_stream_conditions_like_diffusers(tiny_xl):
    """The UNet call of an SDXL stream gets what diffusers' SDXL pipeline gives its UNet: both
    encoders' states, the pooled text, the time ids of the output size, zeros for the empty
    negative prompt."""
    pipe = diffusers_pipe(tiny_xl)
    embeds, negative, pooled, negative_pooled = pipe.encode_prompt("a red fox", device=torch.device("cpu"),
                                                                   do_classifier_free_guidance=True)
    ids = pipe._get_add_time_ids((32, 48), (0, 0), (32, 48), torch.float32, text_encoder_projection_dim=32)
    seen = []
    tiny_xl.unet.register_forward_pre_hook(lambda m, a, kw: seen.append(kw), with_kwargs=True)
    try:
        s = stream(tiny_xl, width=48, height=32, cfg_type="full", guidance_scale=2.0, mode="txt2img")
        s.push(None)
    finally:
        tiny_xl.unet._forward_pre_hooks.clear()
    kw = seen[-1]  # rows: the negative's, then the prompt's
    rows = kw["encoder_hidden_states"].shape[0] // 2
    torch.testing.assert_close(kw["encoder_hidden_states"][rows:], embeds.expand(rows, -1, -1))
    torch.testing.assert_close(kw["encoder_hidden_states"][:rows], negative.expand(rows, -1, -1))
    torch.testing.assert_close(kw["added_cond_kwargs"]["text_embeds"][rows:], pooled.expand(rows, -1))
    torch.testing.assert_close(kw["added_cond_kwargs"]["text_embeds"][:rows], negative_pooled.expand(rows, -1))
    torch.testing.assert_close(kw["added_cond_kwargs"]["time_ids"], ids.expand(2 * rows, -1))


def test_sdxl_prompt_blend_blends_the_pooled_text_too(tiny_xl):
    """A blend of prompts is field by field: SDXL's pooled text is blended like its token states."""
    from streamstudio.pipelines.image.prompt_encoder import PromptEncoder

    enc = PromptEncoder(tiny_xl.tokenizer, tiny_xl.text_encoder, torch.device("cpu"), torch.float32,
                        tiny_xl.tokenizer_2, tiny_xl.text_encoder_2)
    a, b = enc.encode("a red fox"), enc.encode("a blue lake")
    mix = enc.blend([("a red fox", 3.0), ("a blue lake", 1.0)])
    torch.testing.assert_close(mix.text, 0.75 * a.text + 0.25 * b.text)
    torch.testing.assert_close(mix.text_embeds, 0.75 * a.text_embeds + 0.25 * b.text_embeds)
    ref = sdxl.encode_prompts(["a red fox"], [tiny_xl.tokenizer, tiny_xl.tokenizer_2],
                              [tiny_xl.text_encoder, tiny_xl.text_encoder_2], torch.device("cpu"), torch.float32)
    assert torch.equal(a.text, ref.embeds) and torch.equal(a.text_embeds, ref.pooled)
    assert torch.equal(enc.negative("").text_embeds, torch.zeros_like(a.text_embeds))
    assert torch.equal(enc.negative("blurry").text, enc.encode("blurry").text)
