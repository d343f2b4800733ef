"""Training of the built-in image model (`streamstudio train-image`).

joint (the default, what the shipped model ran): the autoencoder, the UNet and the text
   encoder learn together, end to end through the pipeline's own one-step img2img: an image
   (a crop of a photograph, `models/image/photo_data.py`, or a procedural one) is encoded to
   unit-power latents, noised at a t of the pipeline's schedule, the UNet's eps goes through the
   turbo step, and the decoded x0 must match the look the prompt names applied to the image (L1
   on pixels and on their differences). The encoder so learns latents whose structure survives
   the noise the pipeline adds (a joint source-channel code), which a frozen autoencoder
   trained alone cannot: this is what keeps a photograph's edges at strength 0.5. The
   autoencoder's own reconstruction (no noise) is a second term, for small strengths. With
   --edge-weight, both pictures also pay 1 - the correlation of their Sobel edge maps with the
   target's (what benchmarks/image_quality.py measures): L1 averages an edge it is unsure of
   into a blur, the correlation asks for the edge. --init with --latent-channels starts from a
   trained model with its latents widened by repetition (builtin_image.widen_latents).

The older two-stage recipe (`--stage all`, or `vae` and `denoiser` alone):

1. vae: the pixel-shuffle autoencoder learns to reconstruct procedural images
   (`models/image/image_data.py`) and the looks applied to them: L1 on pixels plus L1 on their
   horizontal and vertical differences (edges), with a little noise on the latents so the
   decoder forgives the denoiser's errors. Its `scaling_factor` is then set so latents have
   unit variance.
2. denoiser: with the autoencoder frozen, the UNet and the text encoder learn a one-step,
   turbo-style x0 prediction through the pipeline's own step: for an input latent z, the
   target latent z' of the look the prompt names, and a timestep t of the pipeline's schedule,
   x = sqrt(abar_t) z + sqrt(1 - abar_t) n and x0 = (x - sqrt(1 - abar_t) eps) / sqrt(abar_t)
   must match z' (in latents, and in pixels through the frozen decoder). Half the samples use
   the t the pipeline uses for strength 0.5 and one step (the default), the rest other img2img
   strengths and txt2img's t. With residual CFG "self" the pipeline takes eps_uncond to be the
   noise it added, so guidance above 1 pushes the look further.

Every batch is a pure function of (seed, stage, step), so a resumed run continues exactly where
the stopped one would have been. The checkpoint folder holds model.safetensors and
config.json (what `models/image/loading.py` loads as `--model builtin`), plus optimizer.pt and
trainer_state.json for --resume.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from diffusers import LCMScheduler
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from streamstudio.app.training.loop import cosine_lr
from streamstudio.device import pick_device
from streamstudio.errors import StreamStudioError
from streamstudio.models.image import builtin_image, image_data
from streamstudio.models.image.image_net import DiffusersImageNet, ImageCond
from streamstudio.models.image.tiny import SCHEDULER_CONFIG
from streamstudio.app.training.config import STAGES, ImageTrainConfig  # noqa: F401 (re-exported)
from streamstudio.models.image.photo_data import PhotoSet
from streamstudio.pipelines.image.stream_diffusion import StreamDiffusionConfig

PREDICTIONS = ("", "epsilon", "v_prediction")  # "": the resumed run's or the --init model's (else epsilon)

log = logging.getLogger(__name__)

def pipeline_timesteps() -> tuple[int, list[int], int]:
    """(default t, img2img ts, txt2img t) exactly as the pipeline's schedule picks them: the t of
    strength 0.5 with one step, every t img2img uses for strengths 0.2-0.9 and 1-4 steps, and
    txt2img's first t."""
    sched = LCMScheduler.from_config(SCHEDULER_CONFIG)
    sched.set_timesteps(50)

    def ts(**kw) -> list[int]:
        return [int(sched.timesteps[i]) for i in StreamDiffusionConfig(**kw).resolved_t_index_list()]

    default = ts(strength=0.5, steps=1)[0]
    others = sorted({t for s in (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9) for n in (1, 2, 3, 4)
                     for t in ts(strength=s, steps=n)})
    txt = ts(mode="txt2img", steps=1)[0]
    return default, others, txt


def alphas_cumprod() -> torch.Tensor:
    return LCMScheduler.from_config(SCHEDULER_CONFIG).alphas_cumprod.to(torch.float32)  # (1000,)


def _edges(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x[..., :, 1:] - x[..., :, :-1], x[..., 1:, :] - x[..., :-1, :]


def sobel_magnitude(x: torch.Tensor) -> torch.Tensor:
    """(B, H, W) Sobel gradient magnitude of the luminance of images (B, 3, H, W), edges
    replicated: image_metrics.sobel (Rec. 601 luma) in torch, differentiable."""
    y = (x * torch.tensor([0.299, 0.587, 0.114], device=x.device, dtype=x.dtype).view(1, 3, 1, 1)).sum(1)
    p = torch.nn.functional.pad(y[:, None], (1, 1, 1, 1), mode="replicate")[:, 0]
    gx = (p[:, :-2, 2:] + 2 * p[:, 1:-1, 2:] + p[:, 2:, 2:]) - (p[:, :-2, :-2] + 2 * p[:, 1:-1, :-2] + p[:, 2:, :-2])
    gy = (p[:, 2:, :-2] + 2 * p[:, 2:, 1:-1] + p[:, 2:, 2:]) - (p[:, :-2, :-2] + 2 * p[:, :-2, 1:-1] + p[:, :-2, 2:])
    return (gx.pow(2) + gy.pow(2) + 1e-8).sqrt()


def edge_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(B,) 1 - Pearson correlation of the Sobel edge maps (what image_metrics.edge_correlation
    measures): edges where the target has them, of any overall strength."""
    a, b = sobel_magnitude(pred).flatten(1), sobel_magnitude(target).flatten(1)
    a, b = a - a.mean(1, keepdim=True), b - b.mean(1, keepdim=True)
    return 1 - (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1) + 1e-6)


def recon_loss(pred: torch.Tensor, target: torch.Tensor, per_sample: bool = False) -> torch.Tensor:
    """L1 on pixels and on their differences (images in [-1, 1]); (B,) with per_sample."""
    (px, py), (tx, ty) = _edges(pred), _edges(target)
    dims = (1, 2, 3) if per_sample else None

    def l1(a, b):
        return (a - b).abs().mean(dim=dims)

    return l1(pred, target) + 0.5 * (l1(px, tx) + l1(py, ty))


def export_checkpoint(run: str | Path, dest: str | Path) -> Path:
    """Write the shippable model of a training run: float16 weights (about 2.7 MB) and
    config.json, without the optimizer state (what assets/image_builtin holds)."""
    run, dest = Path(run), Path(dest)
    if not (run / "model.safetensors").is_file():
        raise StreamStudioError(f"no checkpoint in {run}: train first (streamstudio train-image --output {run})")
    dest.mkdir(parents=True, exist_ok=True)
    state = {k: v.to(torch.float16) for k, v in load_file(str(run / "model.safetensors")).items()}
    save_file(state, str(dest / "model.safetensors"))
    info = json.loads((run / "config.json").read_text())
    info["weights_dtype"] = "float16"
    (dest / "config.json").write_text(json.dumps(info, indent=1))
    return dest


class ImageTrainer:
    """`ImageTrainer(cfg).train()` -> {"vae": [losses], "denoiser": [losses]} of the steps run."""

    def __init__(self, cfg: ImageTrainConfig):
        if cfg.stage not in STAGES:
            raise StreamStudioError(f"unknown stage {cfg.stage!r}; use one of {', '.join(STAGES)}")
        for name in ("vae_size", "size"):
            if getattr(cfg, name) < 16 or getattr(cfg, name) % 8:
                raise StreamStudioError(f"--{name.replace('_', '-')} must be a multiple of 8, at least 16")
        self.cfg = cfg
        self.out = Path(cfg.output)
        self.device = pick_device("cpu" if cfg.cpu else "auto")
        # (a JSON document: trainer_state.json)
        self.state: dict[str, Any] = {"vae_step": 0, "step": 0, "joint_step": 0, "seconds": 0.0, "scaled": False,
                                      "losses": {}}
        config = None
        self.saved_prediction = None  # the resumed run's or the --init model's prediction type
        if cfg.resume and cfg.init:
            raise StreamStudioError("--init starts a new run from a model; --resume continues a run: use one")
        if cfg.latent_channels and not cfg.init:
            raise StreamStudioError("--latent-channels widens the model given by --init; give --init DIR")
        if cfg.prediction not in PREDICTIONS:
            raise StreamStudioError(f"--prediction {cfg.prediction!r}: "
                                    f"use one of {', '.join(p for p in PREDICTIONS if p)}")
        if cfg.resume:
            config = self._read_config()
        elif cfg.init:
            config = self._read_init_config()
        self.prediction = cfg.prediction or self.saved_prediction or "epsilon"
        self.parts = builtin_image.build(config, seed=cfg.seed)
        for name in ("unet", "vae", "text_encoder"):
            self.parts[name].to(self.device)
        self.vae_opt = torch.optim.AdamW(self.parts["vae"].parameters(), lr=cfg.vae_lr, weight_decay=0.0)
        params = list(self.parts["unet"].parameters()) + list(self.parts["text_encoder"].parameters())
        self.opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
        self.joint_opt = torch.optim.AdamW([p for n in ("vae", "unet", "text_encoder")
                                            for p in self.parts[n].parameters()],
                                           lr=cfg.lr, weight_decay=0.0)
        self.photos = None
        if cfg.photos and cfg.photo_share > 0:
            self.photos = PhotoSet(cfg.photos, "train", progress=cfg.progress)
        if cfg.resume:
            self._resume()
        elif cfg.init:
            self._init_from(Path(cfg.init))
        self.t_default, self.t_img2img, self.t_txt = pipeline_timesteps()
        self.abar = alphas_cumprod().to(self.device)

    # ------------------------------------------------------------------ checkpoints
    def _read_config(self) -> dict:
        path = self.out / "config.json"
        if not (self.out / "trainer_state.json").is_file() or not path.is_file():
            raise StreamStudioError(f"nothing to resume in {self.out}: no trainer_state.json; "
                                    "run without --resume to start a new run")
        return self._model_config(json.loads(path.read_text()))

    def _model_config(self, info: dict) -> dict:
        """A saved config.json's model part; its prediction type noted in self.saved_prediction."""
        self.saved_prediction = info.get("scheduler", {}).get("prediction_type", "epsilon")
        return info["model"]

    def _read_init_config(self) -> dict:
        path = Path(self.cfg.init) / "config.json"
        if not path.is_file() or not (path.parent / "model.safetensors").is_file():
            raise StreamStudioError(f"--init {self.cfg.init}: no model.safetensors and config.json there "
                                    "(give a trained model folder, e.g. streamstudio/assets/image_builtin)")
        # the init model's own, for _init_from
        config = self.init_config = self._model_config(json.loads(path.read_text()))
        if self.cfg.latent_channels and self.cfg.latent_channels != config["vae"]["latent_channels"]:
            try:  # the widened config; _init_from widens the weights the same way
                config, _ = builtin_image.widen_latents(config, {}, self.cfg.latent_channels, weights=False)
            except ValueError as e:
                raise StreamStudioError(f"--latent-channels: {e}") from e
        return config

    def _init_from(self, folder: Path) -> None:
        """A trained model's weights (float16 ones too) as the start of a new run: its
        autoencoder counts as trained (scaled, all --vae-steps done); the denoiser trains on."""
        state = {k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()}
        channels = self.parts["config"]["vae"]["latent_channels"]
        if channels != self.init_config["vae"]["latent_channels"]:  # _read_init_config widened the config
            _, state = builtin_image.widen_latents(self.init_config, state, channels)
        builtin_image.load_state(self.parts, state)
        self.state.update(vae_step=self.cfg.vae_steps, scaled=True)

    def _resume(self) -> None:
        builtin_image.load_state(self.parts, load_file(str(self.out / "model.safetensors")))
        self.state.update(json.loads((self.out / "trainer_state.json").read_text()))
        opt_file = self.out / "optimizer.pt"
        if opt_file.is_file():
            opts = torch.load(opt_file, weights_only=True)
            self.vae_opt.load_state_dict(opts["vae"])
            self.opt.load_state_dict(opts["denoiser"])
            if "joint" in opts:
                self.joint_opt.load_state_dict(opts["joint"])

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        model_cfg = dict(self.parts["config"])
        model_cfg["vae"] = {k: v for k, v in dict(self.parts["vae"].config).items() if not k.startswith("_")}
        train = asdict(self.cfg)
        info = {"name": builtin_image.BUILTIN_NAME, "model": model_cfg,
                "scheduler": dict(SCHEDULER_CONFIG, prediction_type=self.prediction),
                "step_type": "turbo", "default_size": 256,
                "train": train, "trained": {"vae_steps": self.state["vae_step"], "denoiser_steps": self.state["step"],
                                            "joint_steps": self.state.get("joint_step", 0),
                                            "seconds": round(self.state["seconds"], 1),
                                            "final_losses": {k: v[-1] for k, v in self.state["losses"].items() if v}}}
        tmp = self.out / "model.safetensors.tmp"
        save_file(builtin_image.state_dict(self.parts), str(tmp))
        tmp.replace(self.out / "model.safetensors")
        (self.out / "config.json").write_text(json.dumps(info, indent=1, default=list))
        torch.save({"vae": self.vae_opt.state_dict(), "denoiser": self.opt.state_dict(),
                    "joint": self.joint_opt.state_dict()}, self.out / "optimizer.pt")
        (self.out / "trainer_state.json").write_text(json.dumps(self.state))
        log.info("saved vae step %d, denoiser step %d to %s", self.state["vae_step"], self.state["step"], self.out)

    # ------------------------------------------------------------------ stage 1: autoencoder
    def vae_loss(self, step: int) -> torch.Tensor:
        cfg = self.cfg
        seed = (cfg.seed * 1_000_003 + step) * 2
        images, targets, _ = image_data.styled_batch(seed, cfg.vae_batch_size, cfg.vae_size)
        half = cfg.vae_batch_size // 2  # half plain images, half with a look applied
        x = torch.cat([images[:half], targets[half:]]).to(self.device) * 2 - 1  # (B, 3, S, S) in [-1, 1]
        vae = self.parts["vae"]
        z = vae.encode(x).latents
        gen = torch.Generator().manual_seed(seed + 1)
        z_noisy = z + 0.05 * z.detach().std() * torch.randn(z.shape, generator=gen).to(z)
        rec = vae.decode(z_noisy).sample
        return recon_loss(rec, x) + 1e-4 * z.pow(2).mean()

    @torch.no_grad()
    def set_scaling_factor(self) -> float:
        """Latents' standard deviation over a few batches -> scaling_factor = 1 / std."""
        vae = self.parts["vae"]
        zs = [vae.encode(image_data.random_images(10_000 + i, 16, 128).to(self.device) * 2 - 1).latents
              for i in range(4)]
        std = float(torch.cat(zs).std())
        vae.register_to_config(scaling_factor=1.0 / std)
        self.state["scaled"] = True
        log.info("latent std %.4f: scaling_factor %.4f", std, 1.0 / std)
        return 1.0 / std

    # ------------------------------------------------------------------ stage 2: denoiser
    def _timesteps(self, gen: torch.Generator, batch: int) -> torch.Tensor:
        u = torch.rand(batch, generator=gen)
        pick = torch.randint(len(self.t_img2img), (batch,), generator=gen)
        t = torch.tensor(self.t_img2img)[pick]
        t = torch.where(u < self.cfg.default_share, torch.tensor(self.t_default), t)
        t = torch.where(u > 1 - self.cfg.txt2img_share, torch.tensor(self.t_txt), t)
        return t  # (B,)

    def encode_text(self, prompts: list[str]) -> torch.Tensor:
        tok = self.parts["tokenizer"]
        ids = tok(prompts, padding="max_length", max_length=tok.model_max_length, truncation=True,
                  return_tensors="pt").input_ids
        return self.parts["text_encoder"](ids.to(self.device))[0]  # (B, L, D)

    def one_step(self, net: DiffusersImageNet, z: torch.Tensor, gen: torch.Generator,
                 prompts: list[str], t: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The pipeline's one step on scaled latents z (B, C, s, s): a t of its schedule drawn from
        `gen` (or the t (B,) given), z noised to x_t with the noise drawn from `gen`, the UNet's
        output through the turbo step: an eps model's x0 = (x - sqrt(1 - abar) eps) / sqrt(abar),
        a v model's x0 = sqrt(abar) x - sqrt(1 - abar) v (v = sqrt(abar) eps - sqrt(1 - abar) x0,
        Salimans & Ho 2022: nothing divides by sqrt(abar), 0.068 at txt2img's t). Returns (t (B,),
        abar (B, 1, 1, 1), x0)."""
        t = (self._timesteps(gen, z.shape[0]) if t is None else t).to(self.device)
        noise = torch.randn(z.shape, generator=gen).to(self.device)
        abar = self.abar[t].view(-1, 1, 1, 1)
        alpha, beta = abar.sqrt(), (1 - abar).sqrt()
        x = alpha * z + beta * noise
        out = net.eps(x, t, ImageCond(text=self.encode_text(prompts)))  # the UNet's output: eps or v
        if self.prediction == "v_prediction":
            return t, abar, alpha * x - beta * out
        return t, abar, (x - beta * out) / alpha

    def denoiser_loss(self, step: int) -> torch.Tensor:
        cfg = self.cfg
        seed = (cfg.seed * 1_000_003 + step) * 2 + 1
        images, targets, prompts = image_data.styled_batch(seed, cfg.batch_size, cfg.size, cfg.style_share)
        net = DiffusersImageNet(self.parts["unet"], self.parts["vae"])  # the pipeline's seam (scaled latents)
        x_target = targets.to(self.device) * 2 - 1
        with torch.no_grad():
            z_in = net.encode(images.to(self.device) * 2 - 1)  # (B, 4, s, s)
            z_out = net.encode(x_target)
        gen = torch.Generator().manual_seed(seed + 1)
        t, abar, x0 = self.one_step(net, z_in, gen, prompts)
        w = (abar / self.abar[self.t_default]).clamp(0.05, 1.0)  # txt2img's x0 is 14x the eps error
        loss = ((x0 - z_out).pow(2) * w).mean()
        if cfg.pixel_weight:
            rec = net.decode(x0)  # through the frozen decoder
            loss = loss + cfg.pixel_weight * (w * (rec - x_target).abs()).mean()
        return loss

    # ------------------------------------------------------------------ joint: all networks, end to end
    def joint_batch(self, seed: int) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
        """(inputs, targets, prompts) in [0, 1]: photo crops (photo_share of the batch, when
        --photos is given) and procedural images, each with a prompt and its look."""
        cfg = self.cfg
        n_land = round(cfg.batch_size * cfg.landscape_share)
        n_photo = round(cfg.batch_size * cfg.photo_share) if self.photos is not None else 0
        n_photo = min(n_photo, cfg.batch_size - n_land)
        parts = []
        if n_photo:
            assert self.photos is not None  # (no photo crops without --photos)
            parts.append(self.photos.crops(seed, n_photo, cfg.size))
        if cfg.batch_size - n_photo - n_land:
            parts.append(image_data.random_images(seed, cfg.batch_size - n_photo - n_land, cfg.size))
        images = torch.cat(parts)
        targets, prompts = image_data.styled(images, seed, cfg.style_share)
        if n_land:  # landscape layouts under prompts that name one: what txt2img draws for those words
            land, land_targets, land_prompts = self.landscape_batch(seed + 3, n_land, cfg.size)
            images, targets = torch.cat([images, land]), torch.cat([targets, land_targets])
            prompts = prompts + land_prompts
        return images, targets, prompts

    def landscape_batch(self, seed: int, n: int, size: int) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
        """(inputs, targets, prompts): n landscape layouts of `size` pixels, each under a prompt that
        names a landscape (and sometimes a look)."""
        land = image_data.landscapes(seed, n, size)
        targets, prompts = image_data.styled(land, seed, self.cfg.style_share, image_data.LANDSCAPE_WORDS)
        words = image_data.LANDSCAPE_WORDS
        prompts = [p if any(w in p.split() for w in words) else f"a {words[(seed + k) % len(words)]}, {p}".strip(", ")
                   for k, p in enumerate(prompts)]  # every one names a landscape
        return land, targets, prompts

    def layout_loss(self, net: DiffusersImageNet, seed: int) -> torch.Tensor:
        """txt2img of one landscape at --layout-size pixels, from pure noise at txt2img's t: x0 must
        be the layout (L1 on pixels and latents). Sky over ground needs the picture's whole height:
        the UNet has no position embedding, only its convolutions' zero padding tells top from
        bottom, and at the 96-pixel crops that is learned at a 6x6 grid of 1/16 tokens, not the
        16x16 grid of the pipeline's 256 pixels."""
        _, target, prompts = self.landscape_batch(seed, 1, self.cfg.layout_size)
        x_target = target.to(self.device) * 2 - 1
        with torch.no_grad():
            z_target = net.encode(x_target)
        gen = torch.Generator().manual_seed(seed + 1)
        _, _, x0 = self.one_step(net, z_target, gen, prompts, t=torch.full((1,), self.t_txt))
        return self.cfg.layout_weight * (recon_loss(net.decode(x0), x_target)
                                         + self.cfg.latent_weight * (x0 - z_target).pow(2).mean())

    def joint_loss(self, step: int) -> torch.Tensor:
        cfg = self.cfg
        seed = (cfg.seed * 1_000_003 + step) * 2 + 1
        images, targets, prompts = self.joint_batch(seed)
        net = DiffusersImageNet(self.parts["unet"], self.parts["vae"])  # the pipeline's seam (scaled latents)
        x_in, x_target = images.to(self.device) * 2 - 1, targets.to(self.device) * 2 - 1
        z = net.encode(x_in)  # (B, C, s, s), with gradients: the encoder learns what survives the noise
        gen = torch.Generator().manual_seed(seed + 1)
        if step < cfg.ae_warmup:  # the autoencoder first: through the noise from the start, the decoder
            # learns the mean picture and the encoder gets no gradient (measured: a collapse)
            z_noisy = z + 0.1 * torch.randn(z.shape, generator=gen).to(z)
            return recon_loss(net.decode(z_noisy), x_in)
        t, _, x0 = self.one_step(net, z, gen, prompts)
        w = torch.where(t == self.t_txt, cfg.txt2img_weight, 1.0)  # (B,)
        picture = net.decode(x0)
        loss = (w * recon_loss(picture, x_target, per_sample=True)).mean()
        if cfg.edge_weight:  # img2img samples only: txt2img's target is the look's mean, not its edges
            loss = loss + cfg.edge_weight * ((t != self.t_txt) * edge_loss(picture, x_target)).mean()
        half = cfg.batch_size // 2  # the autoencoder on plain pictures and on looks (which the decoder must draw)
        x_ae = torch.cat([x_in[:half], x_target[half:]])
        z_ae = net.encode(x_ae)
        if cfg.ae_weight:
            rec = net.decode(z_ae)
            loss = loss + cfg.ae_weight * recon_loss(rec, x_ae)
            if cfg.edge_weight:
                loss = loss + cfg.ae_weight * cfg.edge_weight * edge_loss(rec, x_ae).mean()
        if cfg.latent_weight:  # x0 toward the look's own latents: the direct signal that teaches the looks
            with torch.no_grad():
                z_target = torch.cat([net.encode(x_target[:half]), z_ae[half:]])
            loss = loss + cfg.latent_weight * (w.view(-1, 1, 1, 1) * (x0 - z_target).pow(2)).mean()
        if cfg.layout_size:
            loss = loss + self.layout_loss(net, seed + 5)
        return loss

    # ------------------------------------------------------------------ loop
    def _run(self, name: str, total: int, key: str, loss_fn, opt, params, base_lr: float, start: float,
             modules) -> list[float]:
        cfg = self.cfg
        losses: list[float] = []
        bar = tqdm(total=total, initial=self.state[key], disable=not cfg.progress, desc=f"train-image ({name})",
                   mininterval=2.0)
        for m in modules:
            m.train()
        tick = time.time()
        while self.state[key] < total:
            if cfg.max_minutes and time.time() - start > 60 * cfg.max_minutes:
                log.info("stopping: --max-minutes %.1f reached", cfg.max_minutes)
                self.stopped = True
                break
            step = self.state[key]
            for group in opt.param_groups:
                group["lr"] = cosine_lr(base_lr, step, total, cfg.warmup, cfg.min_lr_ratio)
            loss = loss_fn(step)
            loss.backward()
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            self.state[key] += 1
            losses.append(float(loss.detach()))
            self.state["losses"].setdefault(name, []).append(round(losses[-1], 5))
            self.state["losses"][name] = self.state["losses"][name][-2000:]
            bar.update(1)
            bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.4f}", refresh=False)
            if self.state[key] % cfg.save_every == 0 or self.state[key] == total:
                self.state["seconds"] += time.time() - tick
                tick = time.time()
                self.save()
        self.state["seconds"] += time.time() - tick
        bar.close()
        for m in modules:
            m.eval()
        return losses

    def train(self) -> dict[str, list[float]]:
        cfg = self.cfg
        start = time.time()
        self.stopped = False
        out: dict[str, list[float]] = {}
        vae, unet, text = self.parts["vae"], self.parts["unet"], self.parts["text_encoder"]
        if cfg.stage == "joint":
            if not vae.config.power_norm:
                raise StreamStudioError("the joint stage trains a power-normalised autoencoder (the default "
                                        "config); this model's autoencoder is not one: use --stage all")
            params = [p for m in (vae, unet, text) for p in m.parameters()]
            for m in (vae, unet, text):
                m.requires_grad_(True)
            out["joint"] = self._run("joint", cfg.steps, "joint_step", self.joint_loss, self.joint_opt, params,
                                     cfg.lr, start, [vae, unet, text])
            self.state["scaled"] = True  # power-normalised latents: scaling_factor 1
            self.save()
            return out
        if cfg.stage in ("all", "vae"):
            vae.requires_grad_(True)
            out["vae"] = self._run("vae", cfg.vae_steps, "vae_step", self.vae_loss, self.vae_opt,
                                   list(vae.parameters()), cfg.vae_lr, start, [vae])
            if self.state["vae_step"] >= cfg.vae_steps and not self.state["scaled"]:
                self.set_scaling_factor()
                self.save()
        if cfg.stage in ("all", "denoiser") and not self.stopped:
            if cfg.stage == "denoiser" and self.state["vae_step"] == 0:
                raise StreamStudioError("the denoiser stage needs a trained autoencoder: run --stage vae first "
                                        "(or --stage all), with the same --output")
            if not self.state["scaled"]:
                self.set_scaling_factor()
            vae.requires_grad_(False).eval()
            params = list(unet.parameters()) + list(text.parameters())
            out["denoiser"] = self._run("denoiser", cfg.steps, "step", self.denoiser_loss, self.opt, params,
                                        cfg.lr, start, [unet, text])
        self.save()
        return out
