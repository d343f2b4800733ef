"""`streamstudio train-image`: train the built-in image model (autoencoder, UNet and text encoder end to end).

    streamstudio train-image --fetch-photos data/photos     # the training photographs (Debian packages)
    streamstudio train-image --output runs/image_builtin --photos data/photos --max-minutes 45
    streamstudio train-image --output runs/image_builtin --resume     # continue a stopped run

    streamstudio train-image --output runs/image_builtin --export streamstudio/assets/image_builtin

The checkpoint folder loads as `--model runs/image_builtin`; --export writes its float16 weights
and config (what `--model builtin` loads) to another folder. See docs/image_model.md.
"""

from __future__ import annotations

import argparse

from streamstudio.app.cli.train_args import add_run_arguments
from streamstudio.app.settings import number
from streamstudio.app.training.config import STAGES, ImageTrainConfig

DEFAULTS = ImageTrainConfig()


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("train-image", description=__doc__.splitlines()[0])
    p.add_argument("--output", default=DEFAULTS.output, help="checkpoint folder (model.safetensors + config.json)")
    p.add_argument("--stage", choices=STAGES, default=DEFAULTS.stage,
                   help="joint (default: every network end to end through the pipeline's step), all (autoencoder, "
                        "then denoiser), vae, or denoiser (needs a trained autoencoder in --output)")
    p.add_argument("--photos", default=DEFAULTS.photos, metavar="DIR",
                   help="the unpacked photograph packages (see --fetch-photos); without it, procedural images only")
    p.add_argument("--photo-share", type=number(float, 0, 1), default=DEFAULTS.photo_share,
                   help=f"share of each batch cut from the photographs (default {DEFAULTS.photo_share})")
    p.add_argument("--ae-warmup", type=number(int, 0, 10**8), default=DEFAULTS.ae_warmup,
                   help="joint stage: first steps that train the autoencoder alone")
    p.add_argument("--ae-weight", type=number(float, 0, 100), default=DEFAULTS.ae_weight,
                   help="joint stage: weight of the autoencoder's own reconstruction")
    p.add_argument("--fetch-photos", default=None, metavar="DIR",
                   help="download the listed Debian photograph packages into DIR (apt-get download, "
                        "dpkg-deb -x) and stop")
    p.add_argument("--vae-steps", type=number(int, 1, 10**8), default=DEFAULTS.vae_steps, help="autoencoder steps")
    p.add_argument("--vae-batch-size", type=number(int, 1, 4096), default=DEFAULTS.vae_batch_size)
    p.add_argument("--vae-size", type=number(int, 8, 4096, multiple=8), default=DEFAULTS.vae_size,
                   help="autoencoder training crops, pixels")
    p.add_argument("--vae-lr", type=number(float, 0, 1, low_open=True), default=DEFAULTS.vae_lr)
    p.add_argument("--steps", type=number(int, 1, 10**8), default=DEFAULTS.steps, help="joint or denoiser steps")
    p.add_argument("--batch-size", type=number(int, 1, 4096), default=DEFAULTS.batch_size)
    p.add_argument("--size", type=number(int, 8, 4096, multiple=8), default=DEFAULTS.size,
                   help="joint or denoiser training crops, pixels")
    p.add_argument("--lr", type=number(float, 0, 1, low_open=True), default=DEFAULTS.lr)
    p.add_argument("--warmup", type=number(int, 0, 10**8), default=DEFAULTS.warmup)
    p.add_argument("--pixel-weight", type=number(float, 0, 100), default=DEFAULTS.pixel_weight,
                   help="weight of the denoiser's pixel loss through the frozen decoder")
    p.add_argument("--style-share", type=number(float, 0, 1), default=DEFAULTS.style_share,
                   help=f"share of denoiser prompts naming a style (default {DEFAULTS.style_share})")
    p.add_argument("--init", default="", metavar="DIR",
                   help="start from a trained model folder (e.g. streamstudio/assets/image_builtin): "
                        "its autoencoder is kept, the denoiser trains on (a new run, not --resume)")
    p.add_argument("--latent-channels", type=number(int, 0, 256), default=DEFAULTS.latent_channels, metavar="C",
                   help="with --init: widen the model's latents to C channels, a multiple of its own (each channel "
                        "repeated, then trained on; 0 keeps them)")
    p.add_argument("--edge-weight", type=number(float, 0, 100), default=DEFAULTS.edge_weight,
                   help="joint stage: weight of the edge term (1 - correlation of Sobel edge maps, output vs look)")
    p.add_argument("--layout-size", type=number(int, 0, 4096, multiple=16), default=DEFAULTS.layout_size, metavar="PX",
                   help="joint stage: also train one txt2img landscape a step at PX pixels (the pipeline's size, 256: "
                        "sky over ground needs the whole height; 0: none)")
    p.add_argument("--layout-weight", type=number(float, 0, 100), default=DEFAULTS.layout_weight, metavar="W",
                   help="the layout term's weight (with --layout-size; 0.3, as txt2img's samples in the batch)")
    p.add_argument("--prediction", choices=("epsilon", "v_prediction"), default="",
                   help="what the UNet predicts (default: the resumed run's or the --init model's, else epsilon). "
                        "v_prediction: x0 = sqrt(abar) x - sqrt(1 - abar) v, so text to image's one step from pure "
                        "noise does not divide the UNet's error by sqrt(abar) (0.068); with --init, the model "
                        "learns the new output anew")
    add_run_arguments(p, DEFAULTS.seed, DEFAULTS.save_every)
    p.add_argument("--export", default=None, metavar="DIR",
                   help="afterwards, write the shippable model (float16 weights + config.json) to DIR")
    return p


