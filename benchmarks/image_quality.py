"""Quality of the built-in image model on photographs nobody here trained or tuned on (issue 30).

The judging photographs are scikit-image's bundled astronaut, coffee, cat (chelsea), rocket and
motorcycle (`photo_data.held_out`), centre-cropped and resized to 256x256; with `--photos DIR`
the training list's `tune` photographs (kept out of training, looked at while tuning) are
measured too and reported apart. The pipeline runs with the Live tab's defaults for a turbo
model: one step, strength 0.5, guidance 1.0, residual CFG "self".

- autoencoder: PSNR and SSIM of decode(encode(x)), beside bicubic down and up by the latent's
  factor (the baseline a learned codec of that compression should beat);
- structure: Sobel edge correlation of img2img's output ("" and "a photo") with its input, beside
  a Gaussian blur of sigma 4 and an unrelated photograph (target: >= 0.6 on every photo, and
  above the blur on each);
- colours: redness of "red" minus "blue", blueness of "blue" minus "red", saturation of "black
  and white" over "", sepia's warmth;
- styles: for each style word, how much closer the output is to the style's own rendering of
  the input (`image_data.apply_style`) than the plain prompt's output is (mean absolute
  difference), and how far it is from the plain output;
- txt2img: "red" vs "blue" colour, "" vs random noise (high-frequency energy), top vs bottom of
  "a landscape", the saturation of "a black and white photo of a cat" and of "a photo of a cat";
- speed: img2img frames per second at 256x256 on 2 CPU threads (target >= 15), and the model's
  file size (target < 20 MB).

    python3 benchmarks/image_quality.py [--model builtin|DIR] [--photos DIR] [--label NAME]

Each run is stored under its label in benchmarks/results/image_quality.json and printed against
the targets.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from common import RESULTS, bench_device, utc_now, write_json  # noqa: F401 (sys.path set by common)

from streamstudio.models.image import image_data, image_metrics as m, photo_data
from streamstudio.models.image.loading import BUILTIN_DIR, load_components
from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion, StreamDiffusionConfig

SIZE = 256
STYLE_WORDS = ("pencil sketch", "watercolor", "oil painting", "pixel art", "posterized", "blurry")
TARGETS = {"edge_min": 0.6, "fps_min": 15.0, "size_mb_max": 20.0}


def pipeline(comps, mode: str = "img2img", size: int = SIZE) -> StreamDiffusion:
    return StreamDiffusion(comps, StreamDiffusionConfig(width=size, height=size, steps=1, strength=0.5,
                                                        guidance_scale=1.0, mode=mode), prompt="")


def run_prompts(pipe: StreamDiffusion, image: np.ndarray, prompts) -> dict[str, np.ndarray]:
    out = {}
    for prompt in prompts:
        pipe.set_prompt(prompt)
        out[prompt] = pipe(image)
    return out


@torch.no_grad()
def autoencode(comps, image: np.ndarray) -> np.ndarray:
    net = comps.net
    x = torch.from_numpy(image).permute(2, 0, 1).float()[None] / 127.5 - 1
    y = net.decode(net.encode(x.to(net.device, net.dtype)))
    return ((y[0].float().clamp(-1, 1) + 1) * 127.5).round().byte().permute(1, 2, 0).cpu().numpy()


def edge_figures(img: np.ndarray, out: np.ndarray) -> dict:
    """Sobel edge correlation of the output with its input, and of a sigma-4 blur (the baseline)."""
    return {"edge": m.edge_correlation(img, out), "edge_blur4": m.edge_correlation(img, m.gaussian_blur(img, 4.0))}


def photo_figures(comps, pipe: StreamDiffusion, photos: dict[str, np.ndarray]) -> dict:
    prompts = ("", "a photo", "red", "blue", "black and white", "sepia", *STYLE_WORDS)
    names = list(photos)
    factor = comps.vae_scale_factor
    rows = {}
    for i, (name, img) in enumerate(photos.items()):
        out = run_prompts(pipe, img, prompts)
        ae = autoencode(comps, img)
        other = photos[names[(i + 1) % len(names)]]
        row = {
            "ae_psnr": m.psnr(ae, img), "ae_ssim": m.ssim(ae, img),
            "bicubic_psnr": m.psnr(m.bicubic_down_up(img, factor), img),
            "bicubic_ssim": m.ssim(m.bicubic_down_up(img, factor), img),
            **edge_figures(img, out[""]), "edge_a_photo": m.edge_correlation(img, out["a photo"]),
            "edge_unrelated": m.edge_correlation(img, other),
            "ssim": m.ssim(out[""], img),
            "red_minus_blue_redness": m.redness(out["red"]) - m.redness(out["blue"]),
            "blue_minus_red_blueness": m.blueness(out["blue"]) - m.blueness(out["red"]),
            "bw_saturation": m.saturation(out["black and white"]), "plain_saturation": m.saturation(out[""]),
            "sepia_warmth": m.redness(out["sepia"]) - m.redness(out[""]),
            "styles": {},
        }
        x = torch.from_numpy(img).permute(2, 0, 1).float()[None] / 255
        for word in STYLE_WORDS:
            look = image_data.parse_prompt(word)
            target = (image_data.apply_style(x, look.style)[0].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
            row["styles"][word] = {"toward": m.mean_abs(out[""], target) - m.mean_abs(out[word], target),
                                   "from_plain": m.mean_abs(out[word], out[""])}
        rows[name] = row
    return rows


def more_figures(pipe: StreamDiffusion, photos: dict[str, np.ndarray]) -> dict:
    """Edge correlation of img2img (no prompt) and of the sigma-4 blur, per picture, printed."""
    rows = {}
    for name, img in photos.items():
        pipe.set_prompt("")
        out = pipe(img)
        rows[name] = edge_figures(img, out)
    print("\nmore held out (edge / blur4): " + ", ".join(f"{k} {v['edge']:.3f}/{v['edge_blur4']:.3f}"
                                                       for k, v in rows.items()))
    edges = [v["edge"] for v in rows.values()]
    print(f"  edge >= {TARGETS['edge_min']} on {sum(e >= TARGETS['edge_min'] for e in edges)} of {len(edges)}, "
          f"above the blur on {sum(v['edge'] > v['edge_blur4'] for v in rows.values())}")
    return rows


def txt2img_figures(comps) -> dict:
    pipe = pipeline(comps, "txt2img")
    out = {}
    for prompt in ("", "red", "blue", "a landscape", "a black and white photo of a cat", "a photo of a cat"):
        pipe.set_prompt(prompt)
        out[prompt] = pipe()
    noise = np.random.default_rng(0).integers(0, 256, out[""].shape, dtype=np.uint8)

    def hf(img):  # mean absolute Laplacian of the luminance: high-frequency energy
        y = m.luma(img)
        return float(np.abs(4 * y[1:-1, 1:-1] - y[:-2, 1:-1] - y[2:, 1:-1] - y[1:-1, :-2] - y[1:-1, 2:]).mean())

    land = out["a landscape"]
    half = land.shape[0] // 2
    return {"red_minus_blue_redness": m.redness(out["red"]) - m.redness(out["blue"]),
            "hf_plain": hf(out[""]), "hf_noise": hf(noise),
            "landscape_top_minus_bottom_blueness": m.blueness(land[:half]) - m.blueness(land[half:]),
            "landscape_top_minus_bottom_luma": float(m.luma(land[:half]).mean() - m.luma(land[half:]).mean()),
            "cat_bw_saturation": m.saturation(out["a black and white photo of a cat"]),
            "cat_photo_saturation": m.saturation(out["a photo of a cat"])}


def speed(comps, image: np.ndarray, frames: int = 40) -> float:
    pipe = pipeline(comps)
    for _ in range(5):
        pipe(image)
    start = time.perf_counter()
    for _ in range(frames):
        pipe(image)
    return frames / (time.perf_counter() - start)


def summarise(rows: dict) -> dict:
    keys = [k for k in next(iter(rows.values())) if k != "styles"]
    out = {k: {"min": min(r[k] for r in rows.values()), "mean": float(np.mean([r[k] for r in rows.values()]))}
           for k in keys}
    words = next(iter(rows.values()))["styles"]
    out["styles"] = {w: {k: float(np.mean([r["styles"][w][k] for r in rows.values()]))
                         for k in ("toward", "from_plain")}
                     for w in words}
    return out


def print_table(label: str, rows: dict) -> None:
    print(f"\n{label}: {'photo':12s} {'edge':>6s} {'blur4':>6s} {'unrel':>6s} {'AE psnr':>8s} {'bicubic':>8s} "
          f"{'AE ssim':>8s} {'bic ssim':>8s} {'red-blue':>8s} {'bw sat':>7s}")
    for name, r in rows.items():
        ok = "ok" if r["edge"] >= TARGETS["edge_min"] and r["edge"] > r["edge_blur4"] else "MISS"
        print(f"{'':{len(label) + 2}s}{name:12s} {r['edge']:6.3f} {r['edge_blur4']:6.3f} {r['edge_unrelated']:6.3f} "
              f"{r['ae_psnr']:8.2f} {r['bicubic_psnr']:8.2f} {r['ae_ssim']:8.3f} {r['bicubic_ssim']:8.3f} "
              f"{r['red_minus_blue_redness']:8.3f} {r['bw_saturation']:7.3f}  {ok}")
    styles = summarise(rows)["styles"]
    print("  styles (mean over the photos): " + ", ".join(
        f"{w} toward {v['toward']:+.3f} / from plain {v['from_plain']:.3f}" for w, v in styles.items()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="builtin")
    ap.add_argument("--photos", default=None, help="the unpacked training photographs: also measure the tune split")
    ap.add_argument("--more", action="store_true",
                    help="also scikit-image's other bundled pictures (photo_data.MORE_HELD_OUT): edges only")
    ap.add_argument("--label", default=None)
    ap.add_argument("--frames", type=int, default=40, help="frames timed for the speed figure")
    ap.add_argument("--output", default=str(RESULTS / "image_quality.json"))
    args = ap.parse_args()
    bench_device("cpu")
    comps = load_components(args.model)
    pipe = pipeline(comps)
    held = photo_data.held_out(SIZE)
    result = {"date": utc_now(), "model": args.model, "threads": torch.get_num_threads(),
              "held_out": photo_figures(comps, pipe, held)}
    print_table("held out", result["held_out"])
    if args.more:
        result["held_out_more"] = more_figures(pipe, photo_data.held_out(SIZE, more=True))
    if args.photos:
        tune = photo_data.PhotoSet(args.photos, "tune", short_side=SIZE)
        photos = {}
        for e, img in zip(tune.entries, tune.images):
            name = e.path.split("/")[3] if "/wallpapers/" in e.path else Path(e.path).stem
            top, left = (img.shape[0] - SIZE) // 2, (img.shape[1] - SIZE) // 2
            photos[name] = img[top:top + SIZE, left:left + SIZE]
        result["tune"] = photo_figures(comps, pipe, photos)
        print_table("tune", result["tune"])
    result["summary"] = {k: summarise(result[k]) for k in ("held_out", "tune") if k in result}
    result["txt2img"] = txt2img_figures(comps)
    print("\ntxt2img:", ", ".join(f"{k} {v:.3f}" for k, v in result["txt2img"].items()))
    result["fps_256"] = speed(comps, held["astronaut"], args.frames)
    folder = BUILTIN_DIR if args.model == "builtin" else Path(args.model)
    result["size_mb"] = sum(f.stat().st_size for f in folder.glob("model.safetensors")) / 1e6
    print(f"speed: {result['fps_256']:.1f} fps img2img 256x256 on {result['threads']} threads (target >= "
          f"{TARGETS['fps_min']}); weights {result['size_mb']:.1f} MB (target < {TARGETS['size_mb_max']})")
    path = Path(args.output)
    store = json.loads(path.read_text()) if path.is_file() else {}
    store[args.label or args.model] = result
    write_json(path, store)
    print(f"stored as {args.label or args.model!r} in {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
