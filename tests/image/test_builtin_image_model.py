"""The built-in image model (assets/image_builtin) through the whole image pipeline: on
photographs nobody here trained or tuned on (scikit-image's, `photo_data.held_out`) and on the
test card, img2img keeps the input's edges, and the prompt's look shows (colours, black and white,
the named styles), at 256x256 with one step at strength 0.5 (the pipeline's defaults for a turbo
model); txt2img follows colour and landscape words.

The bounds are the figures measured on the shipped checkpoint with a margin
(benchmarks/image_quality.py and docs/image_model.md record the measured values).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from streamstudio.models.image import image_data, photo_data
from streamstudio.models.image.image_metrics import (blueness, edge_correlation, gaussian_blur, mean_abs, psnr, redness,
                                                     saturation, ssim)
from streamstudio.models.image.loading import BUILTIN_DIR, load_components
from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion, StreamDiffusionConfig

SIZE = 256


# ---------------------------------------------------------------------------------------------
# The shipped model through the pipeline
# ---------------------------------------------------------------------------------------------

STYLE_WORDS = ("pencil sketch", "watercolor")  # the styles docs/image_model.md names (the others measured not to show)
PROMPTS = ("", "red", "blue", "black and white", "sepia", *STYLE_WORDS)


@pytest.fixture(scope="module")
def comps():
    return load_components("builtin")


def _img2img(comps, pictures: dict[str, np.ndarray], prompts) -> dict[str, dict[str, np.ndarray]]:
    """Each picture through img2img (256x256, 1 step, strength 0.5, guidance 1: the Live tab's
    turbo defaults) with each prompt."""
    pipe = StreamDiffusion(comps, StreamDiffusionConfig(width=SIZE, height=SIZE, steps=1, strength=0.5,
                                                        guidance_scale=1.0), prompt="")
    out = {}
    for name, img in pictures.items():
        out[name] = {"input": img}
        for prompt in prompts:
            pipe.set_prompt(prompt)
            out[name][prompt] = pipe(img)
    return out


@pytest.fixture(scope="module")
def photos(comps):
    return _img2img(comps, photo_data.held_out(SIZE), PROMPTS)


@pytest.fixture(scope="module")
def outputs(comps):
    return _img2img(comps, {"card": image_data.test_card(SIZE)}, ("", "red", "blue", "black and white"))["card"]


def test_shipped_and_small():
    size = (BUILTIN_DIR / "model.safetensors").stat().st_size
    assert size < 20 * 10**6, f"the built-in model is {size / 1e6:.1f} MB"
    info = json.loads((BUILTIN_DIR / "config.json").read_text())
    assert info["name"] == "builtin" and info["step_type"] == "turbo" and info["trained"]["joint_steps"] > 0


def test_loads_as_a_demo_turbo_model(comps):
    assert comps.name == "builtin" and comps.is_demo and comps.step_type == "turbo"
    assert comps.default_size == 256 and comps.vae_scale_factor == 4 and comps.net.latent_channels == 32
    ids = comps.tokenizer("a red pencil sketch", padding="max_length", max_length=comps.tokenizer.model_max_length,
                          truncation=True, return_tensors="pt").input_ids
    assert comps.tokenizer.convert_ids_to_tokens(ids[0, :5].tolist())[1:] == ["a</w>", "red</w>", "pencil</w>",
                                                                           "sketch</w>"]  # whole words
    assert comps.tokenizer.tokenize("watercolor") == ["watercolor</w>"]
    with torch.inference_mode():
        assert comps.text_encoder(ids)[0].shape == (1, comps.tokenizer.model_max_length, 64)


def test_autoencoder_keeps_photographs(comps):
    for name, img in photo_data.held_out(SIZE).items():
        with torch.inference_mode():
            x = torch.from_numpy(img).permute(2, 0, 1)[None].float() / 127.5 - 1
            z = comps.vae.encode(x).latents
            assert z.shape == (1, 32, SIZE // 4, SIZE // 4)
            rec = ((comps.vae.decode(z).sample.clamp(-1, 1) + 1) * 127.5).round().byte()[0].permute(1, 2, 0).numpy()
        assert psnr(rec, img) > AE_PSNR and edge_correlation(img, rec) > AE_EDGE, name


def test_img2img_keeps_photographs_edges(photos):
    over_blur = []
    names = list(photos)
    for k, (name, out) in enumerate(photos.items()):
        img = out["input"]
        edge = edge_correlation(img, out[""])
        assert edge > EDGE_PHOTO, (name, edge)
        over_blur.append(edge - edge_correlation(img, gaussian_blur(img, 4.0)))
        assert edge_correlation(img, out["red"]) > EDGE_PHOTO - 0.1, name  # a look keeps the picture too
        other = photos[names[(k + 1) % len(names)]][""]
        assert edge_correlation(img, other) < 0.2, name  # (the measure tells pictures apart)
    assert np.mean(over_blur) > EDGE_OVER_BLUR and all(d > 0 for d in over_blur), over_blur


def test_colour_prompts_on_photographs(photos):
    for name, out in photos.items():
        assert redness(out["red"]) > redness(out["blue"]) + RED_MARGIN, name
        assert blueness(out["blue"]) > blueness(out["red"]) + RED_MARGIN, name
        assert saturation(out["black and white"]) < BW_RATIO * saturation(out["input"]), name
        assert redness(out["sepia"]) > redness(out["blue"]), name


def test_every_named_style_moves_the_picture_toward_it(photos):
    """Each style word brings the output closer to the style's own rendering of the input
    (image_data.apply_style) than the plain prompt's output is, averaged over the photographs."""
    for word in STYLE_WORDS:
        look = image_data.parse_prompt(word)
        toward, away = [], []
        for out in photos.values():
            x = torch.from_numpy(out["input"]).permute(2, 0, 1).float()[None] / 255
            target = (image_data.apply_style(x, look.style)[0].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
            toward.append(mean_abs(out[""], target) - mean_abs(out[word], target))
            away.append(mean_abs(out[word], out[""]))
        assert np.mean(toward) > STYLE_TOWARD, (word, np.mean(toward))
        assert np.mean(away) > STYLE_FROM_PLAIN, (word, np.mean(away))


def test_img2img_keeps_the_test_card(outputs):
    card = outputs["input"]
    for prompt in ("", "red", "black and white"):
        assert outputs[prompt].shape == (SIZE, SIZE, 3)
        assert edge_correlation(card, outputs[prompt], block=4) > EDGE_CARD, prompt
    assert ssim(card, outputs[""]) > SSIM_CARD
    assert redness(outputs["red"]) > redness(outputs["blue"]) + RED_MARGIN


def test_txt2img_follows_the_prompt(comps):
    pipe = StreamDiffusion(comps, StreamDiffusionConfig(width=SIZE, height=SIZE, mode="txt2img", steps=1,
                                                        guidance_scale=1.0), prompt="red")
    red = pipe.generate(1)[0]
    pipe.set_prompt("blue")
    blue = pipe.generate(1)[0]
    pipe.set_prompt("")
    plain = pipe.generate(1)[0]
    assert redness(red) > redness(blue) + TXT_RED_MARGIN and blueness(blue) > blueness(red) + TXT_RED_MARGIN
    noise = np.random.default_rng(0).integers(0, 256, plain.shape, dtype=np.uint8)
    lap = np.abs(np.diff(plain.astype(float), 2, axis=0)).mean()  # a smooth picture, not noise
    assert lap < 0.2 * np.abs(np.diff(noise.astype(float), 2, axis=0)).mean()


def test_txt2img_draws_sky_over_ground_for_a_landscape(comps):
    """The pipeline's txt2img at 256x256 (the size the layout term trained at): "a landscape" is
    bluer in its top half than in its bottom half, on every seed tried."""
    tops = []
    for seed in (0, 1, 2):
        pipe = StreamDiffusion(comps, StreamDiffusionConfig(width=SIZE, height=SIZE, mode="txt2img", steps=1,
                                                            guidance_scale=1.0, seed=seed), prompt="a landscape")
        img = pipe()
        tops.append(blueness(img[:SIZE // 2]) - blueness(img[SIZE // 2:]))
    assert min(tops) > LAND_MIN and np.mean(tops) > LAND_MEAN, tops


def test_txt2img_black_and_white_is_grey(comps):
    """The issue's own example: txt2img "a black and white photo of a cat" comes out grey, far
    less saturated than "a photo of a cat", on every seed tried (the eps model before left it
    multicoloured: saturation 0.71, 2.10 and 1.58 times the plain prompt's on these seeds)."""
    for seed in (0, 1, 2):
        pipe = StreamDiffusion(comps, StreamDiffusionConfig(width=SIZE, height=SIZE, mode="txt2img", steps=1,
                                                            guidance_scale=1.0, seed=seed), prompt="a photo of a cat")
        plain = saturation(pipe())
        pipe.set_prompt("a black and white photo of a cat")
        grey = saturation(pipe())
        assert grey < BW_TXT * plain, (seed, grey, plain)


def test_runs_at_512(comps):
    pipe = StreamDiffusion(comps, StreamDiffusionConfig(width=512, height=512, steps=1), prompt="sepia")
    out = pipe(image_data.test_card(512))
    assert out.shape == (512, 512, 3) and edge_correlation(image_data.test_card(512), out, block=8) > EDGE_512


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------

def test_procedural_data_is_seeded():
    a = image_data.styled_batch(5, 3, 32)
    b = image_data.styled_batch(5, 3, 32)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[2] == b[2]
    assert a[0].shape == (3, 3, 32, 32) and 0 <= float(a[0].min()) and float(a[0].max()) <= 1
    look = image_data.parse_prompt("a black and white photo")
    gray = image_data.apply_look(a[0], look)
    assert torch.allclose(gray[:, 0], gray[:, 2])


def test_pipeline_timesteps_are_the_pipelines():
    from streamstudio.app.training.image import pipeline_timesteps

    default, img2img, txt = pipeline_timesteps()
    assert default in img2img and txt == 999 and 0 < default < txt


def test_a_short_joint_run_on_photographs_saves_resumes_and_loads(tmp_path, monkeypatch):
    """train-image's default stage end to end on a few photographs: the autoencoder's warm-up,
    then every network through the pipeline's step; --resume continues, --export loads."""
    from PIL import Image

    from streamstudio.app import cli
    from streamstudio.models.image import photo_data

    root = tmp_path / "photos"
    lines = []
    for k in range(2):
        path = f"usr/share/backgrounds/p{k}.png"
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image_data.test_card(96 + 32 * k)).save(root / path)
        lines.append(f"{path}\tpkg\tGPL-2+\ttrain")
    (tmp_path / "list.tsv").write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(photo_data, "DATA_LIST", tmp_path / "list.tsv")
    out = tmp_path / "run"

    def args(steps: int, *extra: str) -> list[str]:
        return ["train-image", "--output", str(out), "--photos", str(root), "--steps", str(steps), "--ae-warmup", "1",
                "--size", "32", "--batch-size", "2", "--save-every", "2", "--no-progress", *extra]

    assert cli.main(args(2)) == 0
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["joint_step"] == 2 and len(state["losses"]["joint"]) == 2
    assert cli.main(args(3, "--resume", "--layout-size", "48", "--export", str(tmp_path / "shipped"))) == 0
    assert json.loads((out / "trainer_state.json").read_text())["joint_step"] == 3
    assert (tmp_path / "shipped" / "model.safetensors").stat().st_size < (out / "model.safetensors").stat().st_size
    comps = load_components(str(tmp_path / "shipped"))
    assert comps.is_demo and comps.step_type == "turbo" and comps.vae_scale_factor == 4
    pipe = StreamDiffusion(comps, StreamDiffusionConfig(width=64, height=64, steps=1), prompt="red")
    assert pipe(image_data.test_card(64)).shape == (64, 64, 3)


@pytest.mark.slow
def test_the_two_stage_recipe_still_trains(tmp_path):
    from streamstudio.app import cli

    out = tmp_path / "run"
    args = ["train-image", "--stage", "all", "--output", str(out), "--vae-steps", "3", "--steps", "2",
            "--vae-size", "32", "--size", "32", "--vae-batch-size", "2", "--batch-size", "2", "--no-progress"]
    assert cli.main(args) == 0
    state = json.loads((out / "trainer_state.json").read_text())
    assert (state["vae_step"], state["step"]) == (3, 2)


# Bounds: the shipped checkpoint's measured figures (in brackets) with a margin; the figures are
# in docs/image_model.md and benchmarks/results/image_quality.json.
# Bracketed: the shipped v-prediction model's figures; "eps model": the 32-channel model before it, whose
# figures are kept where they were not measured again (it passes every bound but BW_TXT).
AE_PSNR = 18.0  # autoencoder alone on the held-out photographs, dB [20.11 motorcycle - 26.73 rocket]
AE_EDGE = 0.63  # [eps model: 0.691 - 0.817] (the 16-channel model before: 0.656 - 0.785;
                # the 8-channel one: 0.514 - 0.740)
EDGE_PHOTO = 0.6  # img2img "", Sobel edge correlation at full resolution, every held-out photograph [0.665 - 0.810]
                  # (the target; the eps model: 0.648 - 0.792; the 16-channel model: 0.593 - 0.777;
                  # the 8-channel one: 0.405 - 0.705)
EDGE_OVER_BLUR = 0.2  # mean over the photographs of (img2img - a sigma-4 blur)
                      # [+0.294; above it on each, rocket +0.097]
RED_MARGIN = 0.2  # redness red - blue, blueness blue - red, on each photograph
                  # [redness 0.325 - 0.541, blueness 0.299 - 0.505]
BW_RATIO = 0.8  # saturation "black and white" / the input's [benchmark: 0.20 - 0.46; eps model's test: 0.146 - 0.724]
BW_TXT = 0.6  # txt2img saturation "a black and white photo of a cat" / "a photo of a cat", seeds 0-2 [0.202 - 0.353]
              # (the eps model: 0.71, 2.10, 1.58: fails)
STYLE_TOWARD = 0.04  # mean over the photographs of (plain's distance - the style's) to the style's rendering
                     # [pencil sketch 0.288, watercolor 0.069]
STYLE_FROM_PLAIN = 0.08  # mean distance of the style's output from the plain one [0.388, 0.125]
EDGE_CARD = 0.9  # the test card, over 4x4-pixel means [eps model: "" 0.968, red 0.961, black and white 0.969]
SSIM_CARD = 0.72  # [eps model: 0.821]
TXT_RED_MARGIN = 0.15  # txt2img redness red - blue, blueness blue - red [eps model: 0.331, 0.291]
LAND_MIN, LAND_MEAN = 0.03, 0.07  # txt2img "a landscape", top minus bottom blueness, seeds 0-2 [0.120, 0.056, 0.083]
                                  # (eps model: 0.118, 0.083, 0.130; before the layout term: -0.003, -0.014, 0.005)
EDGE_512 = 0.85  # 512x512 "sepia", over 8x8-pixel means [eps model: 0.944]


def test_style_share_raises_the_share_of_style_prompts():
    def styled(prompts):
        return sum(image_data.parse_prompt(p).style is not None for p in prompts) / len(prompts)

    default = styled(image_data.styled_batch(11, 400, 16)[2])
    more = styled(image_data.styled_batch(11, 400, 16, style_share=0.8)[2])
    assert abs(default - image_data.DEFAULT_STYLE_SHARE) < 0.08 and abs(more - 0.8) < 0.08


def test_init_starts_a_new_run_from_the_shipped_model(tmp_path):
    from safetensors.torch import load_file

    from streamstudio.app.training.image import ImageTrainConfig, ImageTrainer

    trainer = ImageTrainer(ImageTrainConfig(output=str(tmp_path / "run"), stage="denoiser", init=str(BUILTIN_DIR),
                                            cpu=True, progress=False))
    shipped = load_file(str(BUILTIN_DIR / "model.safetensors"))
    ours = trainer.parts["vae"].state_dict()
    assert all(torch.equal(ours[k[len("vae."):]], v.float()) for k, v in shipped.items() if k.startswith("vae."))
    assert trainer.state["scaled"] and trainer.state["vae_step"] == trainer.cfg.vae_steps
    with pytest.raises(Exception, match="--init"):
        ImageTrainer(ImageTrainConfig(output=str(tmp_path / "x"), init=str(tmp_path / "none"), cpu=True))


def test_landscape_layouts_put_sky_over_ground_and_are_seeded():
    a, b = image_data.landscapes(4, 6, 64), image_data.landscapes(4, 6, 64)
    assert a.shape == (6, 3, 64, 64) and torch.equal(a, b)
    top, bottom = a[:, :, :16], a[:, :, -16:]
    sky_blue = (top[:, 2] - top[:, :2].mean(1)).mean((1, 2))  # the day skies are bluer at the top than the ground
    assert (sky_blue > (bottom[:, 2] - bottom[:, :2].mean(1)).mean((1, 2))).float().mean() >= 0.5
    assert all(w in image_data.vocabulary() for w in image_data.LANDSCAPE_WORDS)


@pytest.mark.parametrize("prediction", ["epsilon", "v_prediction"])
def test_one_step_recovers_the_clean_latents_from_a_perfect_prediction(tmp_path, monkeypatch, prediction):
    """--prediction: a UNet that outputs the true eps (the noise), or the true v = sqrt(abar) eps -
    sqrt(1 - abar) x0 (Salimans & Ho 2022, "v-parameterization"), makes the turbo step give back
    the clean latents exactly, at txt2img's t and at an img2img one; the exported model says its
    prediction type, which the pipeline reads, and a resumed run keeps it."""
    from streamstudio.app.training.image import DiffusersImageNet, ImageTrainConfig, ImageTrainer
    from streamstudio.models.image.tiny import SCHEDULER_CONFIG
    from diffusers import DDPMScheduler

    run = tmp_path / "run"
    trainer = ImageTrainer(ImageTrainConfig(output=str(run), init=str(BUILTIN_DIR), prediction=prediction,
                                            cpu=True, progress=False))
    net = DiffusersImageNet(trainer.parts["unet"], trainer.parts["vae"])
    abar_all = DDPMScheduler.from_config(SCHEDULER_CONFIG).alphas_cumprod  # the schedule, from diffusers
    z = torch.randn(2, trainer.parts["config"]["vae"]["latent_channels"], 8, 8,
                    generator=torch.Generator().manual_seed(1))
    for t_val in (999, 500):
        noise = torch.randn(z.shape, generator=torch.Generator().manual_seed(5))  # one_step's first draw
        abar = abar_all[t_val]
        truth = noise if prediction == "epsilon" else abar.sqrt() * noise - (1 - abar).sqrt() * z
        monkeypatch.setattr(net, "eps", lambda x, t, cond, truth=truth: truth)
        _, _, x0 = trainer.one_step(net, z, torch.Generator().manual_seed(5), ["a photo"] * 2,
                                    t=torch.full((2,), t_val))
        torch.testing.assert_close(x0, z, rtol=0, atol=2e-4)
    trainer.save()
    assert json.loads((run / "config.json").read_text())["scheduler"]["prediction_type"] == prediction
    assert load_components(str(run)).prediction_type == prediction
    resumed = ImageTrainer(ImageTrainConfig(output=str(run), resume=True, cpu=True, progress=False))
    assert resumed.prediction == prediction


def test_layout_loss_is_txt2img_of_a_landscape_at_the_layout_size(tmp_path, monkeypatch):
    """--layout-size: one landscape a step, drawn from pure noise at txt2img's t (999) at that
    size, under a prompt naming a landscape; its x0 is pulled to the layout (sky over ground)."""
    from streamstudio.app.training.image import DiffusersImageNet, ImageTrainConfig, ImageTrainer

    trainer = ImageTrainer(ImageTrainConfig(output=str(tmp_path / "run"), init=str(BUILTIN_DIR), layout_size=64,
                                            cpu=True, progress=False))
    net = DiffusersImageNet(trainer.parts["unet"], trainer.parts["vae"])
    seen, prompts = [], []
    eps, encode_text = net.eps, trainer.encode_text
    monkeypatch.setattr(net, "eps", lambda x, t, cond: seen.append((x.shape, t.tolist())) or eps(x, t, cond))
    monkeypatch.setattr(trainer, "encode_text", lambda p: prompts.extend(p) or encode_text(p))
    loss = trainer.layout_loss(net, 7)
    c = trainer.parts["config"]["vae"]["latent_channels"]
    assert seen == [((1, c, 16, 16), [999])]
    assert len(prompts) == 1 and set(re.findall(r"[a-z]+", prompts[0])) & set(image_data.LANDSCAPE_WORDS)
    loss.backward()
    assert loss.item() > 0 and trainer.parts["unet"].conv_out.weight.grad.abs().sum() > 0
    assert torch.equal(trainer.layout_loss(net, 7).detach(), loss.detach())  # a pure function of the seed
    trainer.cfg.layout_weight *= 2  # --layout-weight scales the term, and only the term
    torch.testing.assert_close(trainer.layout_loss(net, 7).detach(), 2 * loss.detach())


def test_widened_latents_repeat_each_channel(tmp_path):
    """--latent-channels 2C on the shipped C-channel model: the encoder's latents are each old
    channel twice, and with the copies equal the decoder and the UNet compute what the old ones
    did (the split input weights sum to the old ones): a repetition code, the start of the
    fine-tune (how the shipped model went from 8 to 16 and 32 channels)."""
    from safetensors.torch import load_file

    from streamstudio.app.training.image import ImageTrainConfig, ImageTrainer
    from streamstudio.models.image import builtin_image

    old = builtin_image.build(json.loads((BUILTIN_DIR / "config.json").read_text())["model"])
    builtin_image.load_state(old, {k: v.float() for k, v in load_file(str(BUILTIN_DIR / "model.safetensors")).items()})
    c = old["config"]["vae"]["latent_channels"]
    wide = ImageTrainer(ImageTrainConfig(output=str(tmp_path / "run"), init=str(BUILTIN_DIR), latent_channels=2 * c,
                                         cpu=True, progress=False)).parts
    x = torch.from_numpy(image_data.test_card(64)).permute(2, 0, 1).float()[None] / 127.5 - 1
    text = torch.randn(1, 4, 64)
    with torch.no_grad():
        z_old, z_new = old["vae"].encode(x).latents, wide["vae"].encode(x).latents
        assert z_new.shape[1] == 2 * c
        torch.testing.assert_close(z_new, torch.cat([z_old, z_old], 1))  # power_norm: mean square 1 either way
        torch.testing.assert_close(wide["vae"].decode(z_new).sample, old["vae"].decode(z_old).sample)
        eps_old = old["unet"](z_old, 499, encoder_hidden_states=text).sample
        eps_new = wide["unet"](z_new, 499, encoder_hidden_states=text).sample
        torch.testing.assert_close(eps_new, torch.cat([eps_old, eps_old], 1), atol=1e-4, rtol=1e-4)
    assert wide["config"]["unet"]["in_channels"] == wide["config"]["vae"]["latent_channels"] == 2 * c
    with pytest.raises(Exception, match="multiple"):
        ImageTrainer(ImageTrainConfig(output=str(tmp_path / "x"), init=str(BUILTIN_DIR), latent_channels=c + 1,
                                      cpu=True))
    with pytest.raises(Exception, match="--init"):
        ImageTrainer(ImageTrainConfig(output=str(tmp_path / "y"), latent_channels=2 * c, cpu=True))


def test_edge_loss_is_one_minus_the_benchmarks_edge_correlation():
    from streamstudio.app.training.image import edge_loss

    held = photo_data.held_out(64)
    a, b = held["cat"], held["rocket"]
    for other in (b, gaussian_blur(a, 2), a):
        ta, tb = (torch.from_numpy(p).permute(2, 0, 1).double()[None] / 127.5 - 1 for p in (a, other))
        assert float(1 - edge_loss(ta, tb)[0]) == pytest.approx(edge_correlation(a, other), abs=1e-4)
