"""Peers side by side on the same card: our StreamDiffusion against the peer StreamDiffusion.

The peer is the PyPI package `streamdiffusion==0.1.1` (installed with --no-deps; it is written
for diffusers 0.24 and runs on diffusers 0.42 unchanged). Both pipelines run the SAME modules
(one UNet, one TAESD, one text encoder): img2img, 1 step at strength 0.5 (the peer's
t_index_list [25] of its 50-step LCM schedule, ours from steps=1, strength=0.5), no CFG, in
windows taken in turn (ours, peer, ours, peer, ...), each a closed loop of end-to-end frames:
a uint8 HxWx3 numpy frame in, a uint8 frame out. The peer is fed as its README does: a PIL
image to `stream(image)` (its own preprocessing, `image_processor.preprocess`), the output
through its `postprocess_image(..., output_type="pil")`.

Modes: eager (both as they come); compiled (CUDA only): ours through
`apply_acceleration(comps, "compile")`, the peer's UNet and TAESD encoder and decoder through
torch.compile with the same arguments (what a peer user can do; its TensorRT path is not here).
GPU: sd-turbo architecture (random weights), TAESD, 512x512, fp16. CPU: the tiny model, 64x64, fp32.

Patches the peer needs here, all in this file: none for diffusers 0.42; on a machine without
torchvision, a stand-in module while it imports (its image_utils imports torchvision for a
helper not used here); on the CPU, stand-ins for the CUDA events and synchronisation that its
`__call__` times every frame with.

    python3 benchmarks/peers.py                      # GPU when there is one
    python3 benchmarks/peers.py --device cpu --quick --seconds 1

Writes benchmarks/results/peers.json (device name and date inside). Without the peer package
the JSON records it as missing, and the script exits 0.
"""

from __future__ import annotations

import argparse
import copy
import importlib.metadata
import importlib.util
import statistics
import sys
import time
import types
from pathlib import Path

import numpy as np
import PIL.Image
import torch
from diffusers import LCMScheduler, StableDiffusionPipeline

from common import RESULTS, bench_device, table, utc_now, write_json  # puts the package on sys.path
from stream_diffusion import sd_turbo_architecture

from streamstudio.app.cli.bench_run import device_name
from streamstudio.models.acceleration import compile_kwargs
from streamstudio.models.image.acceleration import apply_acceleration
from streamstudio.models.image.loading import load_components
from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion, StreamDiffusionConfig

PEER = "streamdiffusion"
PEER_VERSION = "0.1.1"
INSTALL = f"pip install --no-deps {PEER}=={PEER_VERSION}"
PROMPT = "a photo"
STEPS, STRENGTH, SCHEDULE = 1, 0.5, 50  # 1 step img2img at strength 0.5 of the 50-step LCM schedule
TARGETS = {"eager": 1.0, "compiled": 1.5}  # ours / peer, at least


def components(device: torch.device):
    if device.type == "cuda":
        return sd_turbo_architecture(device, torch.float16), 512, "sd-turbo arch, TAESD, 512x512, 1 step, fp16"
    comps = load_components("tiny", device=device, dtype=torch.float32, taesd=True)
    return comps, 64, "tiny model, TAESD, 64x64, 1 step, fp32 (CPU)"


def our_config(size: int) -> StreamDiffusionConfig:
    return StreamDiffusionConfig(width=size, height=size, steps=STEPS, strength=STRENGTH, cfg_type="none",
                                 guidance_scale=1.0, step_type="turbo", num_inference_steps=SCHEDULE,
                                 similarity_filter=False, temporal="off")


# ------------------------------------------------------------------------------------ the peer

class _NoEvent:
    """torch.cuda.Event on the CPU: the peer's __call__ times each frame with CUDA events."""

    def __init__(self, **_kwargs):
        pass

    def record(self, *_args):
        pass

    def elapsed_time(self, _other) -> float:
        return 0.0


class _CpuTorch(types.ModuleType):
    """The peer pipeline module's `torch` on the CPU: torch, but with no-op CUDA events and sync."""

    def __init__(self):
        super().__init__("torch")
        self.cuda = types.SimpleNamespace(Event=_NoEvent, synchronize=lambda *a: None)

    def __getattr__(self, name):
        return getattr(torch, name)


def peer_version() -> str | None:
    """The installed peer's version, or None when it cannot be imported from here."""
    if importlib.util.find_spec(PEER) is None:
        return None
    try:
        return importlib.metadata.version(PEER)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def import_peer(device: torch.device) -> tuple[type, object, list[str]]:
    """The peer's StreamDiffusion class, its postprocess_image and the patches applied."""
    patches = []
    stub = None
    if importlib.util.find_spec("torchvision") is None:  # image_utils imports it for pil2tensor only
        stub = sys.modules.setdefault("torchvision", types.ModuleType("torchvision"))
        patches.append("torchvision: a stand-in module while streamdiffusion.image_utils imports (not installed)")
    try:
        import streamdiffusion.pipeline as peer_pipeline
        from streamdiffusion.image_utils import postprocess_image
    finally:
        if stub is not None and sys.modules.get("torchvision") is stub:
            del sys.modules["torchvision"]
    if device.type != "cuda":
        peer_pipeline.torch = _CpuTorch()
        patches.append("CPU: no-op torch.cuda.Event / synchronize in streamdiffusion.pipeline (its per-frame timer)")
    return peer_pipeline.StreamDiffusion, postprocess_image, patches


def peer_frames(peer_cls, postprocess, comps, size: int, compiled: bool):
    """A function uint8 frame -> uint8 frame through the peer, built on `comps`' modules."""
    dtype = comps.unet.dtype
    pipe = StableDiffusionPipeline(vae=comps.vae, text_encoder=comps.text_encoder, tokenizer=comps.tokenizer,
                                   unet=comps.unet, scheduler=LCMScheduler.from_config(comps.scheduler_config),
                                   safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    t_index = our_config(size).resolved_t_index_list()  # [25]: (1 - 0.5) * 50
    stream = peer_cls(pipe, t_index_list=t_index, torch_dtype=dtype, width=size, height=size, cfg_type="none")
    if compiled:  # the stream's own references only: the shared modules stay as they are
        kw = compile_kwargs(comps.unet.device, True)
        stream.unet = torch.compile(comps.unet, **kw)
        vae = copy.copy(comps.vae)
        vae._modules = dict(vae._modules)  # its own submodule table, the parameters shared
        vae.encoder = torch.compile(comps.vae.encoder, **kw)
        vae.decoder = torch.compile(comps.vae.decoder, **kw)
        stream.vae = vae
    stream.prepare(PROMPT, num_inference_steps=SCHEDULE, guidance_scale=1.0)

    def frame(image: np.ndarray) -> np.ndarray:
        out = stream(PIL.Image.fromarray(image))
        return np.asarray(postprocess(out, output_type="pil")[0])

    return frame


def our_frames(comps, size: int, compiled: bool):
    if compiled:
        comps = apply_acceleration(comps, "compile")
    stream = StreamDiffusion(comps, our_config(size), prompt=PROMPT)
    return stream  # uint8 frame -> uint8 frame


# ------------------------------------------------------------------------------------ timing

def window(run, frames: list[np.ndarray], seconds: float) -> float:
    """Frames per second of a closed loop for `seconds` (outputs are host arrays: nothing queued)."""
    run(frames[0])  # the other pipeline ran last: one frame untimed
    count, start = 0, time.perf_counter()
    while True:
        out = run(frames[count % len(frames)])
        count += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
    assert out.dtype == np.uint8 and out.shape == frames[0].shape, (out.dtype, out.shape)
    return count / elapsed


def compare(runs: dict, frames, seconds: float, rounds: int, warmup: int) -> dict:
    """{pipeline: (median fps, every window's fps)}, the windows taken in turn."""
    for run in runs.values():
        for i in range(warmup):
            run(frames[i % len(frames)])
    fps = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            fps[name].append(window(run, frames, seconds))
    return {name: (statistics.median(v), v) for name, v in fps.items()}


def summarise(rows: list[dict], mode: str) -> dict:
    got = {r["pipeline"]: r for r in rows if r["mode"] == mode}
    ours, peer = (got.get(p, {}).get("fps") for p in ("ours", "peer"))
    ratio = ours / peer if ours and peer else None
    return {"ours_fps": ours, "peer_fps": peer, "ratio": ratio, "target": TARGETS[mode],
            "met": None if ratio is None else ratio >= TARGETS[mode]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="auto, cuda or cpu")
    parser.add_argument("--quick", action="store_true", help="two rounds of shorter windows")
    parser.add_argument("--seconds", type=float, default=None, help="one window's seconds (default 5, quick 2)")
    parser.add_argument("--modes", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"])
    parser.add_argument("--out", default=str(RESULTS / "peers.json"))
    args = parser.parse_args(argv)
    device = bench_device(args.device)
    seconds = args.seconds if args.seconds is not None else (2.0 if args.quick else 5.0)
    rounds = 2 if args.quick else 3
    out = Path(args.out)
    result = {"benchmark": "peers", "device": device_name(device), "date": utc_now(), "quick": args.quick,
              "window_s": seconds, "rounds": rounds,
              "peer": {"package": PEER, "wanted": PEER_VERSION, "version": peer_version()},
              "settings": {"mode": "img2img", "steps": STEPS, "strength": STRENGTH, "cfg_type": "none",
                           "io": "uint8 HxWx3 numpy in and out", "prompt": PROMPT},
              "rows": [], "summary": {}, "notes": []}
    if result["peer"]["version"] is None:
        result["peer"]["status"] = "missing"
        result["peer"]["note"] = f"{PEER} is not installed ({INSTALL}): no figures"
        result["summary"] = {m: {"ours_fps": None, "peer_fps": None, "ratio": None, "target": TARGETS[m],
                                 "missing": PEER} for m in args.modes}
        write_json(out, result)
        print(f"{PEER} missing ({INSTALL}); recorded as missing in {out}")
        return 0
    try:
        peer_cls, postprocess, patches = import_peer(device)
    except Exception as exc:  # noqa: BLE001 - installed but broken here (a diffusers change): said, no figures
        result["peer"].update(status="import failed", error=f"{type(exc).__name__}: {exc}")
        write_json(out, result)
        print(f"{PEER} {result['peer']['version']} does not import: {type(exc).__name__}: {exc}")
        return 1
    result["peer"].update(status="ok", patches=patches)
    comps, size, name = components(device)
    result["model"] = name
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(4)]
    rows = result["rows"]
    for mode in args.modes:
        if mode == "compiled" and device.type != "cuda":
            note = "compiled: CUDA only (inductor builds on the CPU take minutes and say nothing about GPUs)"
            result["summary"][mode] = {"skipped": note, "target": TARGETS[mode]}
            result["notes"].append(note)
            continue
        compiled = mode == "compiled"
        try:
            runs = {"ours": our_frames(comps, size, compiled),
                    "peer": peer_frames(peer_cls, postprocess, comps, size, compiled)}
            warmup = 5 if compiled else 3  # compile, and CUDA graphs record on the third call
            for pipeline, (fps, windows) in compare(runs, frames, seconds, rounds, warmup).items():
                rows.append({"mode": mode, "pipeline": pipeline, "fps": fps, "windows_fps": windows})
            result["summary"][mode] = summarise(rows, mode)
        except Exception as exc:  # noqa: BLE001 - keep the other mode's figures
            result["summary"][mode] = {"error": f"{type(exc).__name__}: {exc}", "target": TARGETS[mode]}
            print(f"{mode}: failed: {type(exc).__name__}: {exc}")
        write_json(out, result)
    write_json(out, result)
    print(f"{name} on {result['device']}; peer {PEER} {result['peer']['version']}")
    eager, comp = result["summary"].get("eager", {}), result["summary"].get("compiled", {})
    print(table([("ours eager fps", "oe", ">15.2f"), ("peer eager fps", "pe", ">15.2f"), ("ratio", "re", ">6.2f"),
                 ("ours compiled", "oc", ">14.2f"), ("peer compiled", "pc", ">14.2f"), ("ratio", "rc", ">6.2f")],
                [dict(oe=eager.get("ours_fps"), pe=eager.get("peer_fps"), re=eager.get("ratio"),
                      oc=comp.get("ours_fps"), pc=comp.get("peer_fps"), rc=comp.get("ratio"))]))
    print(f"targets: eager ratio >= {TARGETS['eager']}, compiled ratio >= {TARGETS['compiled']}")
    for note in result["notes"]:
        print(note)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
