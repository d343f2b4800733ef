"""StreamStudio: real-time generative media (stream-batched diffusion, streaming video, splats)."""

from pathlib import Path

__version__ = "0.1.0"

ASSETS = Path(__file__).resolve().parent / "assets"  # the built-in models' weights and the sample scenes
