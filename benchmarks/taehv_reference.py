"""Record the reference TAEHV's outputs on a random-weight model (issue 49).

Runs madebyollin/taehv's own `taehv.py` (a checkout given with --taehv; `fetch` it, nothing of it is
copied into the package) on CPU in float32 with Wan 2.1's layout (its defaults: `taew2_1`) and
seeded random weights (`streamstudio.models.video.taehv.random_state` over the reference's own
state-dict keys and shapes, so the fixture holds the seed, not 11M weights), and writes what
tests/video/test_taehv.py compares StreamStudio's TAEHV codec against:

- `keys`: the reference's `state_dict()` keys and shapes (the published files' names), in order;
- `latents` (n, 16, h, w) and the reference's `decode_video` of them ([0, 1], the first 3 frames
  trimmed), its raw decoder output (`apply_model_with_memblocks`, untrimmed and unclamped) and its
  `StreamingTAEHV` frames (frame by frame, as a live decoder);
- `images` (1 + 4 (n - 1), 3, H, W) in [0, 1] and the reference's `encode_video` of them, and of
  every chunk prefix (the chunks of `chunk` latent frames a stream would encode: 1 + 4 (c - 1)
  frames, then 4c).

    python benchmarks/taehv_reference.py --taehv /path/to/taehv --out tests/video/fixtures/taehv_reference.pt
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import torch

from streamstudio.models.video.taehv import random_state

LATENT = (16, 2, 3)  # (C, h, w): frames of 16x24 pixels
N_LATENT, CHUNK, SEED = 6, 2, 3


def import_reference(root: Path):
    """The reference's taehv.py as a module, from the checkout's root."""
    spec = importlib.util.spec_from_file_location("taehv_reference", root / "taehv.py")
    assert spec is not None and spec.loader is not None, root
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record(ref, seed: int) -> dict:
    model = ref.TAEHV(checkpoint_path=None).eval()  # Wan 2.1's layout (taew2_1)
    keys = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    model.load_state_dict(random_state(keys, seed))
    gen = torch.Generator().manual_seed(seed)
    latents = torch.randn(N_LATENT, *LATENT, generator=gen)  # normalised latents are about N(0, 1)
    frames = 1 + 4 * (N_LATENT - 1)
    images = torch.rand(frames, 3, LATENT[1] * 8, LATENT[2] * 8, generator=gen)
    with torch.no_grad():
        decoded = model.decode_video(latents[None].clone(), parallel=True, show_progress_bar=False)[0]
        sequential = model.decode_video(latents[None].clone(), parallel=False, show_progress_bar=False)[0]
        raw = ref.apply_model_with_memblocks(model.decoder, latents[None].clone(), True, False)[0]
        streaming = ref.StreamingTAEHV(model)
        stream = []
        for z in latents:
            frame = streaming.decode(z[None, None])
            while frame is not None:
                stream.append(frame[0, 0])
                frame = streaming.decode()
        encoded = model.encode_video(images[None].clone(), parallel=True, show_progress_bar=False)[0]
        ends = list(range(1 + 4 * (CHUNK - 1), frames + 1, 4 * CHUNK))
        prefixes = [model.encode_video(images[None, :end].clone(), parallel=True, show_progress_bar=False)[0]
                    for end in ends]
    err = (decoded - sequential).abs().max()
    print(f"reference: parallel vs sequential decode {float(err):.1e}, stream {len(stream)} frames, "
          f"raw decoder range [{float(raw.min()):.2f}, {float(raw.max()):.2f}], "
          f"{float(((decoded > 0) & (decoded < 1)).float().mean()) * 100:.0f}% of decoded values unclamped")
    return {"keys": keys, "seed": seed, "chunk": CHUNK, "latents": latents, "decoded": decoded, "raw": raw,
            "stream": torch.stack(stream), "images": images, "encoded": encoded, "prefix_ends": ends,
            "prefixes": prefixes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--taehv", type=Path, required=True, help="a checkout of madebyollin/taehv")
    ap.add_argument("--out", type=Path, default=Path("tests/video/fixtures/taehv_reference.pt"))
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args()
    case = record(import_reference(args.taehv.resolve()), args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(case, args.out)
    print(f"{len(case['keys'])} keys, decoded {tuple(case['decoded'].shape)}, encoded {tuple(case['encoded'].shape)}; "
          f"wrote {args.out} ({args.out.stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
