"""`streamstudio build-engines`: export a model's networks to ONNX (checked against
onnxruntime) and build fp16 TensorRT engines into the engine cache. Without TensorRT it still
exports and checks the ONNX files and says that engines need TensorRT.

Each engine's batch range is sized from what the app will send it (models/image/acceleration.BatchPlan):
the CFG types streams may use, the steps, the frame buffer and cross-stream batching's max rows
(the UNet's batch is N*k for none/self, N*k + k for initialize, 2*N*k for full, and batching joins
streams' calls up to the max rows, padded to buckets 1, 2, 4, 8, 16). Give the settings the app
runs with, and the engines are the ones it looks up; --batch MIN OPT MAX sets a range by hand."""

from __future__ import annotations

import argparse

from streamstudio.app.settings import LCM_LORA_HELP, number

PARTS = ("unet", "vae_encoder", "vae_decoder")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("build-engines", description=__doc__)
    p.add_argument("--model", default="auto",
                   help="builtin, tiny, a hub id, a diffusers folder or a .safetensors file; auto = "
                        "stabilityai/sd-turbo with a CUDA GPU (downloaded once), else the built-in image model "
                        "(default: auto)")
    p.add_argument("--taesd", action="store_true", help="the TAESD fast VAE instead of the model's own")
    p.add_argument("--lcm-lora", default="auto", metavar="ID|PATH|none", help="the app's --lcm-lora: " + LCM_LORA_HELP)
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="networks to export (default: all)")
    p.add_argument("--video", action="store_true", help="also the StreamDiT video model (built-in tiny checkpoint)")
    p.add_argument("--engine-dir", default=None,
                   help="engine cache folder (default $STREAMSTUDIO_ENGINE_DIR or ~/.cache/streamstudio/engines)")
    p.add_argument("--onnx-dir", default=None, help="where ONNX files go without TensorRT (default <engine-dir>/onnx)")
    p.add_argument("--batch", type=number(int, 1, 1024), nargs=3, default=None, metavar=("MIN", "OPT", "MAX"),
                   help="engine batch range by hand (default: from --cfg, --steps, --frame-buffer-size and "
                        "--max-batch-rows, as the app will send)")
    p.add_argument("--resolution", type=number(int, 64, 4096, multiple=64), nargs=3, default=None,
                   metavar=("MIN", "OPT", "MAX"),
                   help="image size range in pixels, square and non-square within it (default: exactly "
                        "--width x --height, as the app runs)")
    p.add_argument("--width", type=number(int, 8, 4096, multiple=8), default=None,
                   help="image width the app runs at (default 512, 64 for tiny)")
    p.add_argument("--height", type=number(int, 8, 4096, multiple=8), default=None,
                   help="image height the app runs at (default 512, 64 for tiny)")
    p.add_argument("--cfg", nargs="+", choices=("none", "self", "initialize", "full"), default=None,
                   help="CFG types streams may use, the usual one first (default: self, then the other three, "
                        "as web clients may switch)")
    p.add_argument("--steps", type=number(int, 1, 50), default=None,
                   help="denoising steps N (default 1 for turbo models, 2 otherwise)")
    p.add_argument("--frame-buffer-size", type=number(int, 1, 64), default=1,
                   help="frames per stream call k (default 1)")
    p.add_argument("--sequential", action="store_true", help="streams denoise step by step instead of Stream Batch")
    p.add_argument("--max-batch-rows", type=number(int, 0, 1024), default=16,
                   help="cross-stream batching's rows per call, as serve's --max-batch-rows (default 16; 0: no "
                        "batching, as generate and render)")
    p.add_argument("--lora", action="append", default=[], metavar="PATH_OR_ID[:scale]",
                   help="the app's --lora, fused into the UNet engine (its cache key holds the weights); repeatable")
    p.add_argument("--controlnet", action="append", default=[], metavar="ID_OR_PATH",
                   help="the app's --controlnet, exported inside the UNet engine (control image and scale are "
                        "inputs); repeatable, in the app's order")
    p.add_argument("--ip-adapter", default=None, metavar="ID_OR_PATH",
                   help="the app's --ip-adapter (its image embedding and scale are UNet engine inputs)")
    p.add_argument("--precision", choices=("fp16", "fp32"), default="fp16", help="engine precision (default fp16)")
    p.add_argument("--no-check", action="store_true", help="skip the onnxruntime check of the ONNX files")
    p.add_argument("--device", default="auto", help="device the model is loaded on for export (auto, cpu, cuda)")
    p.add_argument("--dtype", default="auto",
                   help="dtype the model is loaded in: auto (float16 on CUDA, float32 on CPU), float16, float32. "
                        "Keep it as the app runs (auto on both): the engine cache is keyed by the weights, dtype "
                        "included, and TensorRT 11 engines run in the exported graph's types")
    return p


