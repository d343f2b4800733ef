"""Wan 2.1 text-to-video checkpoints (diffusers format) as a backbone of the streaming video sampler.

A diffusers Wan folder (the `Wan-AI/Wan2.1-T2V-1.3B-Diffusers` / `-14B-Diffusers` layout:
`model_index.json`, `transformer/` WanTransformer3DModel, `vae/` AutoencoderKLWan,
`text_encoder/` UMT5EncoderModel, `tokenizer/`) loads from a local folder or a hub id (the hub
only when it can be reached) into a `WanModel`: the pieces the buffer sampler needs.

- `WanBackbone`: the transformer behind the video seam's backbone (`velocity`), one timestep per frame (repeated
  over the frame's tokens; diffusers takes per-token timesteps since Wan 2.2), Wan's conventions
  (sigma = 1 - t, timestep sigma * 1000, output noise - data, so velocity dx/dt = -output), and
  classifier-free guidance against the empty prompt when `guidance` is not 1.
- `UMT5TextEncoder`: the prompt as WanPipeline's `_get_t5_prompt_embeds` makes it: cleaned,
  tokenized to 512 tokens, encoded, everything past the prompt's own tokens set to zero.
- `WanCodec`: the video seam's codec (`models/video/video_net.py`) over AutoencoderKLWan, latents
  normalised with the VAE config's `latents_mean` / `latents_std` as WanPipeline does. The VAE is
  causal in time and packs 4 frames
  into one latent frame (`scale_factor_temporal`): the first latent frame of a video is 1 frame,
  every later one 4, so n latent frames are 1 + 4 (n - 1) frames (Wan's 81 frames: 21 latents).
  `decode` decodes one whole clip that way; `stream()` gives a codec whose `decode` continues the
  previous call's video (the VAE decoder's causal cache kept between calls), which is what the
  stream uses: its chunks leave the buffer one after another as the latent frames of one long
  video, so the first chunk of c latent frames decodes to 1 + 4 (c - 1) frames and every later
  chunk to 4 c, without a seam and equal to decoding all the chunks at once.

Device and dtype are explicit: the transformer and the text encoder in `dtype` (bfloat16 on a GPU,
`default_dtype`), the VAE in float32 (as WanPipeline's example loads it).
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch
from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d, unpatchify
from diffusers.pipelines.wan.pipeline_wan import prompt_clean
from huggingface_hub import snapshot_download
from transformers import AutoTokenizer, UMT5EncoderModel

from streamstudio.errors import ModelNotFoundError, StreamStudioError
from streamstudio.models import hub
from streamstudio.models.hub import download_command, quiet_hub
from streamstudio.models.hub import first_line as _first_line

if TYPE_CHECKING:  # (diffusers and transformers load with the model; the classes by their modules' paths:
    #                 diffusers' lazy top-level names are opaque to a type checker)
    from diffusers.models.autoencoders.autoencoder_kl_wan import AutoencoderKLWan
    from diffusers.models.transformers.transformer_wan import WanTransformer3DModel
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

WAN_1_3B = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
WAN_14B = "Wan-AI/Wan2.1-T2V-14B-Diffusers"
# what loading a Wan folder reads (the scheduler is not used: the buffer sampler has its own)
WAN_FILES = ["model_index.json", "transformer/*", "vae/*", "text_encoder/*", "tokenizer/*"]
MAX_TEXT_TOKENS = 512  # WanPipeline's max_sequence_length
WAN_HINT = (f"a diffusers Wan 2.1 text-to-video folder or hub id, e.g. `--model {WAN_1_3B}` "
            f"(`hf download {WAN_1_3B} --local-dir DIR` fetches it, about 30 GB)")

# Sampling defaults of a Wan stream: WanPipeline's 480x832 (the 1.3B model's resolution: 60x104
# latents), its flow shift for 480p (3.0) and guidance (5.0), the StreamDiT buffer layout.
WAN_SAMPLING = {"num_chunks": 4, "chunk_size": 2, "micro_steps": 2, "height": 480, "width": 832,
                "shift": 3.0, "guidance": 5.0}


def default_dtype(device: torch.device | str) -> torch.dtype:
    """Wan's weights are bfloat16: bfloat16 on a GPU, float32 on the CPU."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


# ---------------------------------------------------------------------------------- backbone


class WanBackbone:
    """diffusers' `WanTransformer3DModel` as a backbone, with one timestep per token (Wan 2.2 style).

    Wan's convention is sigma = 1 - t (noise at 1000) and an output of noise - data, so the
    timestep is (1 - t) * 1000 per frame, repeated over the frame's tokens, and the velocity
    dx/dt is the negated output. `text_encoder(prompt)` gives (1, L, text_dim) embeddings
    (UMT5 for real Wan weights). Latents use the transformer's channels (its VAE's latents).
    `guidance` other than 1: classifier-free guidance against the empty prompt,
    v = v("") + guidance * (v(prompt) - v("")), both in one batch of two.
    """

    def __init__(self, transformer: WanTransformer3DModel, text_encoder: Callable[[str], torch.Tensor],
                 guidance: float = 1.0):
        pt, ph, pw = transformer.config["patch_size"]
        if pt != 1:
            raise StreamStudioError(f"the Wan backbone needs a temporal patch of 1 for per-frame timesteps, "
                                    f"got {pt}")
        self.transformer, self.text_encoder, self.patch = transformer, text_encoder, (ph, pw)
        self.guidance = float(guidance)
        self._empty: torch.Tensor | None = None

    def encode_text(self, prompt: str) -> Any:
        text = self.text_encoder(prompt)  # (1, L, text_dim)
        if self.guidance == 1.0:
            return text
        if self._empty is None:
            self._empty = self.text_encoder("")
        return text, self._empty

    def _forward(self, x: torch.Tensor, t: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """x: (B, F, C, H, W), t: (B, F), text: (B or 1, L, D) -> the transformer's output (B, F, C, H, W)."""
        b, f, c, h, w = x.shape
        tokens = (h // self.patch[0]) * (w // self.patch[1])
        timestep = ((1 - t.float()) * 1000).repeat_interleave(tokens, dim=1)  # (B, F * tokens)
        hidden = x.permute(0, 2, 1, 3, 4)  # (B, C, F, H, W)
        out = self.transformer(hidden, timestep=timestep, encoder_hidden_states=text.expand(b, -1, -1),
                               return_dict=False)[0]  # (B, C, F, H, W)
        return out.permute(0, 2, 1, 3, 4)

    def velocity(self, x: torch.Tensor, t: torch.Tensor, text: Any) -> torch.Tensor:
        """x: (B, F, C, H, W), t: (B, F) -> velocity (B, F, C, H, W)."""
        if self.guidance == 1.0:
            return -self._forward(x, t, text)
        cond, empty = text
        b = x.shape[0]
        if cond.shape == empty.shape:  # one call over a batch of two
            out = self._forward(torch.cat([x, x]), torch.cat([t, t]),
                                torch.cat([cond.expand(b, -1, -1), empty.expand(b, -1, -1)]))
            out_cond, out_empty = out[:b], out[b:]
        else:  # embeddings of different lengths (the stand-in encoder): two calls
            out_cond, out_empty = self._forward(x, t, cond), self._forward(x, t, empty)
        return -(out_empty + self.guidance * (out_cond - out_empty))


class HashTextEmbedder:
    """A deterministic stand-in text encoder: one fixed random vector per word (tests, demos)."""

    def __init__(self, dim: int, length: int = 8):
        self.dim, self.length = dim, length

    def __call__(self, prompt: str) -> torch.Tensor:
        words = (prompt.lower().split() or [""])[: self.length]
        rows = [torch.randn(self.dim, generator=torch.Generator().manual_seed(zlib.crc32(w.encode())))
                for w in words]
        return torch.stack(rows)[None]  # (1, L, dim)


# ---------------------------------------------------------------------------------- text


class UMT5TextEncoder:
    """A prompt -> (1, max_length, D) embeddings, as WanPipeline's `_get_t5_prompt_embeds`: the
    prompt cleaned (`prompt_clean`), tokenized with padding to `max_length` (truncated past it),
    encoded with its attention mask, and the rows past its own tokens (EOS included) set to zero."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, encoder: torch.nn.Module, max_length: int = MAX_TEXT_TOKENS,
                 dtype: torch.dtype | None = None):
        self.tokenizer, self.encoder, self.max_length = tokenizer, encoder, max_length
        self.dtype = dtype or next(encoder.parameters()).dtype

    def tokens(self, prompt: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(input ids (1, max_length), attention mask (1, max_length))."""
        inputs = self.tokenizer([prompt_clean(prompt)], padding="max_length", max_length=self.max_length,
                                truncation=True, add_special_tokens=True, return_attention_mask=True,
                                return_tensors="pt")
        return inputs.input_ids, inputs.attention_mask

    @torch.no_grad()
    def __call__(self, prompt: str) -> torch.Tensor:
        ids, mask = self.tokens(prompt)
        device = next(self.encoder.parameters()).device
        length = int(mask.gt(0).sum())
        hidden = self.encoder(ids.to(device), mask.to(device)).last_hidden_state  # (1, L, D)
        out = torch.zeros_like(hidden)
        out[:, :length] = hidden[:, :length]  # padding rows: zero, as WanPipeline
        return out.to(self.dtype)


# ---------------------------------------------------------------------------------- codec


class WanCodec:
    """Frames <-> normalised Wan latents through AutoencoderKLWan (the VideoCodec protocol, with
    the VAE's temporal compression): `encode` takes 1 + 4k frames to 1 + k latent frames,
    `decode` n latent frames to 1 + 4 (n - 1) frames; `stream()` decodes chunk after chunk as
    one video. Latents are (vae latents - latents_mean) / latents_std per channel."""

    def __init__(self, vae: AutoencoderKLWan):
        cfg = vae.config
        self.vae = vae.eval().requires_grad_(False)
        self.temporal = int(cfg["scale_factor_temporal"])  # frames per latent frame (after the first)
        self.spatial = int(cfg["scale_factor_spatial"])  # pixels per latent pixel
        self.channels = int(cfg["z_dim"])
        param = next(vae.parameters())
        self.device, self.dtype = param.device, param.dtype
        shape = (1, self.channels, 1, 1, 1)  # broadcast over (1, C, F, h, w)
        self.mean = torch.tensor(cfg["latents_mean"], dtype=torch.float32).view(shape).to(self.device)
        self.std = torch.tensor(cfg["latents_std"], dtype=torch.float32).view(shape).to(self.device)

    def pixel_frames(self, latent_frames: int) -> int:
        """The frames n latent frames decode to as one video: 1 + 4 (n - 1)."""
        return 1 + self.temporal * (latent_frames - 1) if latent_frames > 0 else 0

    def latent_frames(self, frames: int) -> int:
        return 1 + (frames - 1) // self.temporal

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """(F, 3, H, W) in [-1, 1], F = 1 + 4k, H and W multiples of the spatial factor ->
        normalised latents (1 + k, C, H / 8, W / 8) (the posterior's mode, as WanVideoToVideoPipeline)."""
        f, _, h, w = images.shape
        if (f - 1) % self.temporal or h % self.spatial or w % self.spatial:
            raise StreamStudioError(f"the Wan VAE encodes 1 + {self.temporal}k frames of sides that are multiples "
                                    f"of {self.spatial}; got {f} frames of {w}x{h}")
        x = images.to(self.device, self.dtype).permute(1, 0, 2, 3)[None]  # (1, 3, F, H, W)
        z = self.vae.encode(x).latent_dist.mode().float()  # (1, C, 1 + k, h, w)
        return ((z - self.mean) / self.std)[0].permute(1, 0, 2, 3)  # (1 + k, C, h, w)

    def vae_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Normalised latents (n, C, h, w) -> the VAE's own latents (1, C, n, h, w), as WanPipeline."""
        z = latents.to(self.device, torch.float32).permute(1, 0, 2, 3)[None]  # (1, C, n, h, w)
        return (z * self.std + self.mean).to(self.dtype)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """latents (n, C, h, w) of one clip -> frames (1 + 4 (n - 1), 3, 8h, 8w) in [-1, 1]."""
        out = self.vae.decode(self.vae_latents(latents)).sample  # (1, 3, F, H, W)
        return out[0].permute(1, 0, 2, 3).float()

    def stream(self) -> "WanStreamCodec":
        return WanStreamCodec(self)


class WanStreamCodec:
    """A WanCodec whose `decode` and `encode` continue the video of their earlier calls: the VAE
    decoder's and encoder's causal caches are kept between calls, so chunks one after another give
    exactly what one call on the whole video gives (decoding: the first call's first latent frame
    gives 1 frame, every other latent frame 4; encoding: the first call takes 1 + 4k frames, every
    later one 4k). `reset()` starts a new video."""

    def __init__(self, codec: WanCodec):
        self.codec = codec
        self.spatial = codec.spatial
        self.reset()

    def reset(self) -> None:
        convs = sum(isinstance(m, WanCausalConv3d) for m in self.codec.vae.decoder.modules())
        self._cache: list = [None] * convs  # the decoder's per-conv causal context
        self._first = True
        self.decoded = 0  # latent frames decoded since the start
        enc_convs = sum(isinstance(m, WanCausalConv3d) for m in self.codec.vae.encoder.modules())
        self._enc_cache: list = [None] * enc_convs  # the encoder's
        self.encoded = 0  # frames encoded since the start

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """The next frames (F, 3, H, W) in [-1, 1] -> their normalised latents: the first call's F
        = 1 + 4k frames give 1 + k latent frames, every later call's F = 4k give k (as
        AutoencoderKLWan._encode, with the cache kept; the posterior's mode)."""
        codec, vae = self.codec, self.codec.vae
        f, k = images.shape[0], codec.temporal
        first = self.encoded == 0
        if (f - 1 if first else f) % k or f == 0 or vae.config["patch_size"] is not None:
            raise StreamStudioError(f"the Wan VAE encodes a stream's first 1 + {k}k frames, then {k}k at a "
                                    f"time (Wan 2.1's VAE layout); got {f} frames")
        x = images.to(codec.device, codec.dtype).permute(1, 0, 2, 3)[None]  # (1, 3, F, H, W)
        groups = ([x[:, :, :1]] if first else []) + [x[:, :, i:i + k] for i in range(1 if first else 0, f, k)]
        outs = [vae.encoder(g, feat_cache=self._enc_cache, feat_idx=[0]) for g in groups]
        z = vae.quant_conv(torch.cat(outs, dim=2))[:, :codec.channels].float()  # the mode: the mean half
        self.encoded += f
        return ((z - codec.mean) / codec.std)[0].permute(1, 0, 2, 3)  # (n, C, h, w)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """latents (n, C, h, w), the next n latent frames -> their frames (4n, 3, H, W); the very
        first call's first latent frame gives 1 frame (the first call: 1 + 4 (n - 1))."""
        vae = self.codec.vae
        x = vae.post_quant_conv(self.codec.vae_latents(latents))  # (1, C, n, h, w); a 1x1x1 conv
        outs = []
        for i in range(x.shape[2]):  # as AutoencoderKLWan._decode, with the cache kept
            outs.append(vae.decoder(x[:, :, i:i + 1], feat_cache=self._cache, feat_idx=[0],
                                    first_chunk=self._first))  # (1, 3, 1 or 4, H, W)
            self._first = False
        out = torch.cat(outs, dim=2)
        if vae.config["patch_size"] is not None:
            out = unpatchify(out, patch_size=vae.config["patch_size"])
        self.decoded += x.shape[2]
        return out.clamp(-1, 1)[0].permute(1, 0, 2, 3).float()  # (F, 3, H, W)


# ---------------------------------------------------------------------------------- model


@dataclass
class WanModel:
    """A loaded Wan checkpoint: what a stream over it needs."""

    transformer: WanTransformer3DModel  # in `dtype` on `device`
    codec: WanCodec  # AutoencoderKLWan in float32 on `device`
    text_encoder: UMT5TextEncoder
    name: str
    device: torch.device
    dtype: torch.dtype
    sampling: dict = field(default_factory=lambda: dict(WAN_SAMPLING))

    @property
    def latent_channels(self) -> int:
        return int(self.transformer.config["in_channels"])

    @property
    def patch(self) -> tuple[int, int]:
        _, ph, pw = self.transformer.config["patch_size"]
        return ph, pw

    def parameters(self):
        """The transformer's parameters (their device and dtype are the stream's)."""
        return self.transformer.parameters()

    def latent_size(self, height: int, width: int) -> tuple[int, int]:
        """The latent (h, w) for frames of height x width: the nearest multiple of the patch in
        latent pixels (pixels / 8); the decoded frames are 8x that, resized to the output."""
        step = [self.codec.spatial * p for p in self.patch]
        h, w = (max(1, round(side / s)) * p for side, s, p in zip((height, width), step, self.patch))
        return h, w

    def backbone(self, guidance: float = 1.0, compile: bool = False) -> WanBackbone:
        # (torch.compile's stubs say a plain callable; a module comes back as an OptimizedModule, the
        # module itself to its callers: its config and attributes are the module's)
        transformer = torch.compile(self.transformer) if compile else self.transformer
        return WanBackbone(transformer, self.text_encoder, guidance)  # type: ignore[arg-type]


def pipeline_class(folder: str | os.PathLike) -> str | None:
    """The Wan pipeline a folder holds: model_index.json's `_class_name` when it names a Wan
    pipeline, "WanPipeline" for a folder whose transformer/config.json is a WanTransformer3DModel
    without a model_index.json, else None."""
    folder = Path(folder)
    index = _read_json(folder / "model_index.json")
    if index is not None:
        name = str(index.get("_class_name", ""))
        return name if name.startswith("Wan") else None
    transformer = _read_json(folder / "transformer" / "config.json")
    if transformer is not None and transformer.get("_class_name") == "WanTransformer3DModel":
        return "WanPipeline"
    return None


def is_wan_model(model: str | None) -> bool:
    """A local Wan folder (`pipeline_class`), or a hub id `owner/name` whose name says Wan."""
    if not model:
        return False
    path = Path(os.path.expanduser(model))
    if path.is_dir():
        return pipeline_class(path) is not None
    if path.exists() or model.startswith((".", "/", "~")):
        return False
    return model.count("/") == 1 and "wan" in model.split("/")[1].lower()


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _missing(model: str, why: str) -> ModelNotFoundError:
    return ModelNotFoundError(
        f"Wan model {model!r} could not be loaded: {why}. To get it, run `{download_command(model)}` on a machine "
        f"with network access (it lands in the Hugging Face cache), or `{download_command(model)} --local-dir DIR` "
        f"and pass --model DIR; leave --model out for the built-in video model.")


def resolve_folder(model: str, local_files_only: bool | None = None) -> Path:
    """A local folder as it is; a hub id from the Hugging Face cache, else downloaded when the hub
    can be reached (after a one-line notice of its size). Clear errors otherwise."""
    path = Path(os.path.expanduser(model))
    if path.is_dir():
        return path
    if path.exists() or model.startswith((".", "/", "~")) or model.count("/") != 1:
        raise _missing(model, "no such folder" if not path.exists() else "it is a file, not a diffusers folder")
    with hub.quiet_hub():
        try:
            return Path(snapshot_download(model, allow_patterns=WAN_FILES, local_files_only=True))
        except Exception:  # not in the cache (huggingface_hub's LocalEntryNotFoundError and kin)
            pass
    if local_files_only or hub.offline():
        raise _missing(model, "it is not in the local Hugging Face cache and the hub is off (HF_HUB_OFFLINE)")
    size = hub.hub_download_size(model, WAN_FILES)
    if size is None:
        raise _missing(model, "it is not in the local Hugging Face cache and the Hugging Face hub cannot be reached")
    log.warning("Downloading %s (%.1f GB) into the Hugging Face cache; this happens once.", model, size / 1e9)
    try:
        return Path(hub.download_model(model, WAN_FILES))
    except Exception as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise _missing(model, f"the download failed ({hub.first_line(exc)})") from exc


def check_layout(folder: Path, model: str) -> None:
    """Only Wan text-to-video with one transformer runs here: say what to use instead of the rest."""
    name = pipeline_class(folder)
    index = _read_json(folder / "model_index.json") or {}
    tcfg = _read_json(folder / "transformer" / "config.json") or {}
    if name is None:
        raise ModelNotFoundError(f"{model!r} is not a diffusers Wan folder (no model_index.json naming a Wan "
                                 f"pipeline, no transformer/config.json of a WanTransformer3DModel); give {WAN_HINT}")
    if name != "WanPipeline" or tcfg.get("image_dim") or tcfg.get("in_channels") != tcfg.get("out_channels"):
        raise StreamStudioError(f"{model!r} is a {name} (image-, video- or frame-conditioned Wan); the streaming "
                                f"video pipeline runs Wan text-to-video only: give {WAN_HINT}")
    if (index.get("transformer_2") or [None])[-1] or index.get("boundary_ratio"):
        raise StreamStudioError(f"{model!r} has two expert transformers (Wan 2.2 A14B: one for high noise, one for "
                                f"low); a buffer holds frames at every noise level in one call, which one transformer "
                                f"must serve. Give {WAN_HINT}")
    vcfg = _read_json(folder / "vae" / "config.json") or {}
    if index.get("expand_timesteps") or vcfg.get("patch_size") or (tcfg.get("patch_size") or [1])[0] != 1:
        raise StreamStudioError(f"{model!r} is a Wan 2.2 TI2V-style checkpoint (per-token timesteps of its own, "
                                f"a 48-channel VAE), not tried here; give {WAN_HINT}")


@dataclass
class WanPieces:
    """A Wan folder's text encoder and VAE, without its transformer (a causal generator's base)."""

    codec: WanCodec
    text_encoder: UMT5TextEncoder


def load_wan_pieces(model: str, device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
                    local_files_only: bool | None = None) -> WanPieces:
    """The UMT5 text encoder (in `dtype`) and the VAE (float32) of a diffusers Wan 2.1 folder or hub id."""
    from diffusers import AutoencoderKLWan

    device = torch.device(device)
    dtype = dtype or default_dtype(device)
    folder = resolve_folder(model, local_files_only)
    try:
        with quiet_hub():
            vae = AutoencoderKLWan.from_pretrained(str(folder), subfolder="vae", torch_dtype=torch.float32)
            encoder = UMT5EncoderModel.from_pretrained(str(folder), subfolder="text_encoder", dtype=dtype)
            tokenizer = AutoTokenizer.from_pretrained(str(folder), subfolder="tokenizer")
    except (OSError, ValueError) as exc:
        raise _missing(model, f"its files in {folder} could not be read ({_first_line(exc)})") from exc
    # (transformers wraps PreTrainedModel.to with functools.wraps(nn.Module.to): its stubs read as unbound)
    encoder = encoder.to(device).eval().requires_grad_(False)  # type: ignore[arg-type]
    return WanPieces(WanCodec(vae.to(device)), UMT5TextEncoder(tokenizer, encoder, dtype=dtype))


def load_wan(model: str, device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
             local_files_only: bool | None = None) -> WanModel:
    """Load a diffusers Wan 2.1 text-to-video checkpoint (folder or hub id) onto `device`: the
    transformer and the text encoder in `dtype` (None: `default_dtype(device)`), the VAE in float32."""
    from diffusers import WanTransformer3DModel

    device = torch.device(device)
    dtype = dtype or default_dtype(device)
    folder = resolve_folder(model, local_files_only)
    check_layout(folder, model)
    try:
        with quiet_hub():
            transformer = WanTransformer3DModel.from_pretrained(str(folder), subfolder="transformer", torch_dtype=dtype)
    except (OSError, ValueError) as exc:
        raise _missing(model, f"its files in {folder} could not be read ({_first_line(exc)})") from exc
    pieces = load_wan_pieces(str(folder), device, dtype)
    if pieces.codec.channels != transformer.config.in_channels:
        raise StreamStudioError(f"{model!r}: the VAE's {pieces.codec.channels} latent channels do not match the "
                                f"transformer's {transformer.config.in_channels} input channels")
    transformer = transformer.to(device).eval().requires_grad_(False)
    return WanModel(transformer, pieces.codec, pieces.text_encoder, model, device, dtype)
