"""StreamStudio: real-time generative media (stream-batched diffusion, streaming video, splats)."""

__version__ = "0.1.0"
