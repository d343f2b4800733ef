"""Residual CFG against StreamDiffusion's own code, not against our formulas.

`ReferenceStream` below is the reference implementation (cumulo-autumn/StreamDiffusion,
`src/streamdiffusion/pipeline.py`, class `StreamDiffusion`: `prepare`, `add_noise`,
`scheduler_step_batch`, `unet_step`, `predict_x0_batch`) written out line by line in its own
variable names, cut down to the Stream Batch path on latents (no VAE, no prompt encoding
through a diffusers pipeline, no similarity filter). Its residual-CFG stock update is

    scaled_noise = self.beta_prod_t_sqrt * self.stock_noise
    delta_x = self.scheduler_step_batch(model_pred, scaled_noise, idx)
    delta_x = alpha_next * delta_x / beta_next          (two lines there)
    self.stock_noise = init_noise + delta_x

A real `StreamDiffusion` stream on the tiny model and the reference are driven with the same
UNet, text embeddings, per-slot noise and input latents, and every output (and the buffer and
stock they carry) is compared to float tolerance. The reference starts from a zero buffer and
zero stock, ours primes the buffer with the first frame; rows of the batch never mix, so from
call N - 1 on (every slot holding a real frame) the two must agree exactly, and our primed
first outputs must equal the reference's output for frame 0.

Only frame_buffer_size 1: the reference shifts its stock by one row (`self.init_noise[0:1]`,
`self.stock_noise[:-1]`) and takes one "initialize" row, which is only consistent for k = 1.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streamstudio.kernels import reference as kernels_reference
from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion, StreamDiffusionConfig

SIZE = 32
PROMPT, NEGATIVE = "a red fox", "blurry"


def encode_prompt(comps, prompt: str) -> torch.Tensor:
    """What diffusers' encode_prompt gives for one prompt (no clip skip): (1, 77, D)."""
    tok = comps.tokenizer
    ids = tok(prompt, padding="max_length", max_length=tok.model_max_length, truncation=True,
              return_tensors="pt").input_ids
    with torch.no_grad():
        return comps.text_encoder(ids)[0]


class ReferenceStream:
    """StreamDiffusion's pipeline.py, Stream Batch on, frame_buffer_size 1, on latents."""

    def __init__(self, unet, scheduler, t_index_list, cfg_type, init_noise, prompt_embeds, uncond_embeds,
                 guidance_scale, delta, turbo=False):
        self.unet = unet
        self.scheduler = scheduler
        self.t_list = t_index_list
        self.denoising_steps_num = len(t_index_list)
        self.frame_bff_size = 1
        self.use_denoising_batch = True
        self.do_add_noise = True
        self.batch_size = self.denoising_steps_num * self.frame_bff_size
        self.cfg_type = cfg_type
        self.dtype = torch.float32
        self.device = "cpu"
        self.prepare(init_noise, prompt_embeds, uncond_embeds, guidance_scale, delta, turbo)

    def prepare(self, init_noise, prompt_embeds, uncond_embeds, guidance_scale, delta, turbo):
        # prepare(): buffer and stock start at zero
        self.x_t_latent_buffer = torch.zeros(((self.denoising_steps_num - 1) * self.frame_bff_size,
                                              *init_noise.shape[1:]), dtype=self.dtype)
        if self.cfg_type == "none":
            self.guidance_scale = 1.0
        else:
            self.guidance_scale = guidance_scale
        self.delta = delta

        self.prompt_embeds = prompt_embeds.repeat(self.batch_size, 1, 1)
        if self.use_denoising_batch and self.cfg_type == "full":
            uncond_prompt_embeds = uncond_embeds.repeat(self.batch_size, 1, 1)
        elif self.cfg_type == "initialize":
            uncond_prompt_embeds = uncond_embeds.repeat(self.frame_bff_size, 1, 1)
        if self.guidance_scale > 1.0 and (self.cfg_type == "initialize" or self.cfg_type == "full"):
            self.prompt_embeds = torch.cat([uncond_prompt_embeds, self.prompt_embeds], dim=0)

        self.timesteps = self.scheduler.timesteps
        self.sub_timesteps = []
        for t in self.t_list:
            self.sub_timesteps.append(self.timesteps[t])
        sub_timesteps_tensor = torch.tensor(self.sub_timesteps, dtype=torch.long)
        self.sub_timesteps_tensor = torch.repeat_interleave(sub_timesteps_tensor, repeats=self.frame_bff_size, dim=0)

        self.init_noise = init_noise.clone()  # the reference draws it with randn(generator); here: the stream's
        self.stock_noise = torch.zeros_like(self.init_noise)

        c_skip_list = []
        c_out_list = []
        for timestep in self.sub_timesteps:
            c_skip, c_out = self.scheduler.get_scalings_for_boundary_condition_discrete(timestep)
            if turbo:  # sd-turbo's x0 = F (our extension; the reference always takes the LCM scalings)
                c_skip, c_out = torch.tensor(0.0), torch.tensor(1.0)
            c_skip_list.append(torch.as_tensor(c_skip, dtype=torch.float32))
            c_out_list.append(torch.as_tensor(c_out, dtype=torch.float32))
        self.c_skip = torch.stack(c_skip_list).view(len(self.t_list), 1, 1, 1).to(dtype=self.dtype)
        self.c_out = torch.stack(c_out_list).view(len(self.t_list), 1, 1, 1).to(dtype=self.dtype)

        alpha_prod_t_sqrt_list = []
        beta_prod_t_sqrt_list = []
        for timestep in self.sub_timesteps:
            alpha_prod_t_sqrt = self.scheduler.alphas_cumprod[timestep].sqrt()
            beta_prod_t_sqrt = (1 - self.scheduler.alphas_cumprod[timestep]).sqrt()
            alpha_prod_t_sqrt_list.append(alpha_prod_t_sqrt)
            beta_prod_t_sqrt_list.append(beta_prod_t_sqrt)
        alpha_prod_t_sqrt = torch.stack(alpha_prod_t_sqrt_list).view(len(self.t_list), 1, 1, 1).to(dtype=self.dtype)
        beta_prod_t_sqrt = torch.stack(beta_prod_t_sqrt_list).view(len(self.t_list), 1, 1, 1).to(dtype=self.dtype)
        self.alpha_prod_t_sqrt = torch.repeat_interleave(alpha_prod_t_sqrt, repeats=self.frame_bff_size, dim=0)
        self.beta_prod_t_sqrt = torch.repeat_interleave(beta_prod_t_sqrt, repeats=self.frame_bff_size, dim=0)

    def add_noise(self, original_samples, noise, t_index):
        noisy_samples = (self.alpha_prod_t_sqrt[t_index] * original_samples
                         + self.beta_prod_t_sqrt[t_index] * noise)
        return noisy_samples

    def scheduler_step_batch(self, model_pred_batch, x_t_latent_batch, idx=None):
        if idx is None:
            F_theta = (x_t_latent_batch - self.beta_prod_t_sqrt * model_pred_batch) / self.alpha_prod_t_sqrt
            denoised_batch = self.c_out * F_theta + self.c_skip * x_t_latent_batch
        else:
            F_theta = (x_t_latent_batch - self.beta_prod_t_sqrt[idx] * model_pred_batch) / self.alpha_prod_t_sqrt[idx]
            denoised_batch = self.c_out[idx] * F_theta + self.c_skip[idx] * x_t_latent_batch
        return denoised_batch

    def unet_step(self, x_t_latent, t_list, idx=None):
        if self.guidance_scale > 1.0 and (self.cfg_type == "initialize"):
            x_t_latent_plus_uc = torch.concat([x_t_latent[0:1], x_t_latent], dim=0)
            t_list = torch.concat([t_list[0:1], t_list], dim=0)
        elif self.guidance_scale > 1.0 and (self.cfg_type == "full"):
            x_t_latent_plus_uc = torch.concat([x_t_latent, x_t_latent], dim=0)
            t_list = torch.concat([t_list, t_list], dim=0)
        else:
            x_t_latent_plus_uc = x_t_latent

        model_pred = self.unet(x_t_latent_plus_uc, t_list, encoder_hidden_states=self.prompt_embeds,
                               return_dict=False)[0]

        if self.guidance_scale > 1.0 and (self.cfg_type == "initialize"):
            noise_pred_text = model_pred[1:]
            self.stock_noise = torch.concat([model_pred[0:1], self.stock_noise[1:]], dim=0)
        elif self.guidance_scale > 1.0 and (self.cfg_type == "full"):
            noise_pred_uncond, noise_pred_text = model_pred.chunk(2)
        else:
            noise_pred_text = model_pred
        if self.guidance_scale > 1.0 and (self.cfg_type == "self" or self.cfg_type == "initialize"):
            noise_pred_uncond = self.stock_noise * self.delta
        if self.guidance_scale > 1.0 and self.cfg_type != "none":
            model_pred = noise_pred_uncond + self.guidance_scale * (noise_pred_text - noise_pred_uncond)
        else:
            model_pred = noise_pred_text

        # compute the previous noisy sample x_t -> x_t-1
        if self.use_denoising_batch:
            denoised_batch = self.scheduler_step_batch(model_pred, x_t_latent, idx)
            if self.cfg_type == "self" or self.cfg_type == "initialize":
                scaled_noise = self.beta_prod_t_sqrt * self.stock_noise
                delta_x = self.scheduler_step_batch(model_pred, scaled_noise, idx)
                alpha_next = torch.concat([self.alpha_prod_t_sqrt[1:], torch.ones_like(self.alpha_prod_t_sqrt[0:1])],
                                          dim=0)
                delta_x = alpha_next * delta_x
                beta_next = torch.concat([self.beta_prod_t_sqrt[1:], torch.ones_like(self.beta_prod_t_sqrt[0:1])],
                                         dim=0)
                delta_x = delta_x / beta_next
                init_noise = torch.concat([self.init_noise[1:], self.init_noise[0:1]], dim=0)
                self.stock_noise = init_noise + delta_x
        else:
            denoised_batch = self.scheduler_step_batch(model_pred, x_t_latent, idx)

        return denoised_batch, model_pred

    def encode_image(self, img_latent):  # the VAE part left out: takes the scaled latents
        x_t_latent = self.add_noise(img_latent, self.init_noise[0], 0)
        return x_t_latent

    def predict_x0_batch(self, x_t_latent):
        prev_latent_batch = self.x_t_latent_buffer

        t_list = self.sub_timesteps_tensor
        if self.denoising_steps_num > 1:
            x_t_latent = torch.cat((x_t_latent, prev_latent_batch), dim=0)
            self.stock_noise = torch.cat((self.init_noise[0:1], self.stock_noise[:-1]), dim=0)
        x_0_pred_batch, model_pred = self.unet_step(x_t_latent, t_list)

        if self.denoising_steps_num > 1:
            x_0_pred_out = x_0_pred_batch[-1].unsqueeze(0)
            self.x_t_latent_buffer = (self.alpha_prod_t_sqrt[1:] * x_0_pred_batch[:-1]
                                      + self.beta_prod_t_sqrt[1:] * self.init_noise[1:])
        else:
            x_0_pred_out = x_0_pred_batch
            self.x_t_latent_buffer = None
        return x_0_pred_out


T_INDEX = {2: [18, 35], 3: [10, 24, 38]}


def run_both(comps, steps, cfg, turbo=False, guidance=2.5, delta=0.8, calls=6):
    """Drive our stream and the reference with the same latents; returns both outputs and states."""
    config = StreamDiffusionConfig(width=SIZE, height=SIZE, t_index_list=T_INDEX[steps], cfg_type=cfg,
                                   guidance_scale=guidance, delta=delta, use_denoising_batch=True,
                                   frame_buffer_size=1, step_type="turbo" if turbo else "lcm", seed=7)
    stream = StreamDiffusion(comps, config, prompt=PROMPT, negative_prompt=NEGATIVE)
    gen = torch.Generator().manual_seed(100 + steps)
    shape = (1, *stream.sampler.latent_shape)
    latents = [0.8 * torch.randn(shape, generator=gen) for _ in range(calls)]  # the frames' VAE latents
    feed = iter(latents)
    ours: list[torch.Tensor] = []
    stream.io.encode = lambda images: next(feed).clone()  # the VAE is not under test
    stream.io.decode = lambda x: (ours.append(x.clone()), [np.zeros((SIZE, SIZE, 3), np.uint8)])[1]

    from diffusers import LCMScheduler

    scheduler = LCMScheduler.from_config(comps.scheduler_config)  # as the reference's __init__ / prepare
    scheduler.set_timesteps(config.num_inference_steps)
    ref = ReferenceStream(comps.unet, scheduler, T_INDEX[steps], cfg, stream.sampler._noise,
                          encode_prompt(comps, PROMPT), encode_prompt(comps, NEGATIVE), guidance, delta, turbo)
    theirs, states = [], []
    image = np.zeros((SIZE, SIZE, 3), np.uint8)
    with torch.no_grad():
        for z in latents:
            stream(image)
            theirs.append(ref.predict_x0_batch(ref.encode_image(z)))
            states.append(((stream.sampler._buffer.clone(), stream.sampler._stock.clone()),
                           (ref.x_t_latent_buffer.clone(), ref.stock_noise[:-1].clone())))
    return ours, theirs, states


TOL = dict(atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("steps", [2, 3])
@pytest.mark.parametrize("cfg", ["self", "initialize"])
@pytest.mark.parametrize("turbo", [False, True], ids=["lcm", "turbo"])
def test_stream_matches_reference_unet_step(comps, steps, cfg, turbo):
    ours, theirs, states = run_both(comps, steps, cfg, turbo)
    n = steps
    for call in range(n - 1, len(ours)):  # every slot holds a real frame from call N - 1 on
        torch.testing.assert_close(ours[call], theirs[call], **TOL, msg=lambda m: f"call {call}: {m}")
    for call in range(n - 2, len(ours)):  # the buffer's frames entered at calls >= 0
        (buf, stock), (ref_buf, ref_stock) = states[call]
        torch.testing.assert_close(buf, ref_buf, **TOL)
        torch.testing.assert_close(stock, ref_stock, **TOL, msg=lambda m: f"stock after call {call}: {m}")
    for call in range(n - 1):  # primed outputs: frame 0's own trajectory, the reference's frame-0 output
        torch.testing.assert_close(ours[call], theirs[n - 1], **TOL)
    # the stock matters here: without the residual term the outputs differ
    assert not torch.allclose(ours[-1], run_both(comps, steps, "none")[0][-1], atol=1e-3)


@pytest.mark.parametrize("cfg", ["none", "full"])
def test_stream_matches_reference_without_stock(comps, cfg):
    ours, theirs, _ = run_both(comps, 3, cfg)
    for call in range(2, len(ours)):
        torch.testing.assert_close(ours[call], theirs[call], **TOL)


def test_the_old_stock_formula_fails_this_check(comps, monkeypatch):
    """Stepping beta / alpha * x_t instead of beta * stock (the old update) is caught."""
    real = kernels_reference.stream_step

    def old_stream_step(x_t, eps_text, eps_uncond, stock, noise_next, coef, guidance_scale, delta, cfg):
        x0, x_next, _ = real(x_t, eps_text, eps_uncond, stock, noise_next, coef, guidance_scale, delta, cfg)
        alpha, beta, c_skip, c_out, alpha_next, beta_next = coef.float().view(-1, 6, 1, 1, 1).unbind(1)
        uncond = delta * stock.float()
        eps = uncond + guidance_scale * (eps_text.float() - uncond)
        scaled = beta / alpha * x_t.float()
        delta_x = c_out * ((scaled - beta * eps) / alpha) + c_skip * scaled
        return x0, x_next, noise_next.float() + alpha_next / beta_next * delta_x

    monkeypatch.setattr(kernels_reference, "stream_step", old_stream_step)
    ours, theirs, _ = run_both(comps, 3, "self")
    assert not torch.allclose(ours[-1], theirs[-1], **TOL)
