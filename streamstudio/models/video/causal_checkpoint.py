"""Loading causal video models (issue 49): the released CausVid, Self-Forcing and StreamDiffusionV2
generators, and the project's own causal checkpoints (the built-in one among them).

- **A released generator**: a `.pt` file (or a hub id and file) holding the generator's weights
  in Wan's original layout, under "generator_ema", "generator", "model" or "state_dict", keys
  prefixed "model." (their WanDiffusionWrapper), possibly with FSDP's "_fsdp_wrapped_module." or
  torch.compile's "_orig_mod."; `generator_state` finds them, whatever the wrapping. The text encoder
  (UMT5) and the VAE come from the Wan 2.1 base model (`--base`, a diffusers folder or hub id;
  Wan-AI/Wan2.1-T2V-1.3B-Diffusers by default), as the references load them from Wan's folder.
  The sampling defaults are the family's (`FAMILIES`), read from the references' configs.
- **A project checkpoint** (a folder): `config.json` {"causal": {"model": CausalWanConfig fields,
  "text": {"kind": "hash", "dim", "length"} (`wan.HashTextEmbedder`), "sampling": CausalConfig
  fields and "height"/"width"}}
  and `model.safetensors` (Wan's layout); pixel-space (the latents are the [-1, 1] frames).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import load_file, save_file

from streamstudio.errors import ModelNotFoundError, StreamStudioError
from streamstudio.models import hub
from streamstudio.models.video import taehv as tae
from streamstudio.models.video import wan
from streamstudio.models.video.causal_wan import WAN_1_3B_CONFIG, WAN_14B_CONFIG, CausalWan, CausalWanConfig
from streamstudio.models.video.video_net import PixelCodec, VideoCodec

BUILTIN_CAUSAL = Path(__file__).resolve().parents[2] / "assets" / "causal_tiny"
BUILTIN_CAUSAL_NAMES = ("builtin-causal", "causal-tiny", "causal_tiny")
PREFIXES = ("_fsdp_wrapped_module.", "_orig_mod.", "module.", "model.")

# The families' sampling, from their repositories' configs: chunk (num_frame_per_block), steps
# (denoising_step_list without its final 0; StreamDiffusionV2's first chunk is 1 + 4 frames: 2
# latent frames), warp, shift (timestep_shift), context_t (context_noise;
# None: StreamDiffusionV2 caches the last step's keys), window (frames: 21, the training length; the
# v2v model's num_kv_cache) and sink (num_sink_tokens, in frames). Self-Forcing and CausVid have no
# sink of their own; a live stream of theirs rolls its window past 21 frames with 3 sink frames.
FAMILIES: dict[str, dict[str, Any]] = {
    "self_forcing": {"chunk_frames": 3, "steps": (1000.0, 750.0, 500.0, 250.0), "warp": True, "shift": 5.0,
                     "context_t": 0.0, "window": 21, "sink": 3},
    "causvid": {"chunk_frames": 3, "steps": (1000.0, 757.0, 522.0), "warp": False, "shift": 8.0,
                "context_t": 0.0, "window": 21, "sink": 3},
    "streamdiffusionv2": {"chunk_frames": 1, "first_chunk_frames": 2, "steps": (700.0, 500.0, 400.0, 200.0),
                          "warp": False, "shift": 8.0,
                          "context_t": None, "window": 6, "sink": 3, "strength": 0.8, "motion_aware": True},
}
HUB_FILES = {  # hub id -> (file, family)
    "gdhe17/Self-Forcing": ("checkpoints/self_forcing_dmd.pt", "self_forcing"),
    "tianweiy/CausVid": ("autoregressive_checkpoint/model.pt", "causvid"),
    "jerryfeng/StreamDiffusionV2": ("wan_causal_dmd_v2v/model.pt", "streamdiffusionv2"),
}
WAN_SIZE = {1536: WAN_1_3B_CONFIG, 5120: WAN_14B_CONFIG}  # by the checkpoint's hidden size


@dataclass
class CausalModel:
    """What a causal stream needs: the network, its text encoder, its codec and sampling defaults."""

    model: CausalWan
    text_encoder: Callable[[str], torch.Tensor]
    codec: VideoCodec
    sampling: dict[str, Any] = field(default_factory=dict)
    temporal: int = 1  # video frames per latent frame after the first (Wan's VAE: 4)
    family: str = "project"

    def parameters(self):
        """The network's parameters (their device and dtype are the stream's), as WanModel's."""
        return self.model.parameters()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype


# ------------------------------------------------------------------------------ weights


def generator_state(obj: Any) -> dict[str, torch.Tensor]:
    """The generator's weights in a released checkpoint, keys as `CausalWan` names them."""
    if isinstance(obj, dict):
        for key in ("generator_ema", "generator", "model", "state_dict"):
            if key in obj and isinstance(obj[key], dict):
                return generator_state(obj[key])
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise StreamStudioError("no generator weights in this checkpoint (looked for generator_ema, generator, "
                                "model, state_dict)")
    out = {}
    for key, value in obj.items():
        changed = True
        while changed:
            changed = False
            for p in PREFIXES:
                if key.startswith(p):
                    key, changed = key[len(p):], True
        out[key.replace("._fsdp_wrapped_module", "").replace("._checkpoint_wrapped_module", "")] = value
    return out


def config_for(state: dict[str, torch.Tensor]) -> CausalWanConfig:
    """The Wan size a generator's weights are (1.3B or 14B), checked against their shapes."""
    dim = state["patch_embedding.weight"].shape[0]
    if dim not in WAN_SIZE:
        raise StreamStudioError(f"a causal Wan of hidden size {dim} is not one this loader knows (1536: 1.3B, "
                                "5120: 14B)")
    cfg = WAN_SIZE[dim]
    layers = 1 + max(int(k.split(".")[1]) for k in state if k.startswith("blocks."))
    if layers != cfg.num_layers:
        raise StreamStudioError(f"the checkpoint has {layers} blocks; Wan of hidden size {dim} has {cfg.num_layers}")
    return cfg


def load_weights(model: CausalWan, state: dict[str, torch.Tensor], source: str) -> None:
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise StreamStudioError(f"{source}: the weights do not fit a causal Wan: missing {sorted(missing)[:5]}, "
                                f"unexpected {sorted(unexpected)[:5]}")


# ------------------------------------------------------------------------------ project checkpoints


def save_causal_checkpoint(folder: str | Path, model: CausalWan, text: dict, sampling: dict,
                           extra: dict | None = None) -> Path:
    """A project checkpoint: config.json and model.safetensors (Wan's layout)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"causal": {"model": asdict(model.cfg), "text": text, "sampling": sampling}, **(extra or {})}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    weights = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(weights, str(folder / "model.safetensors"))
    return folder


def is_causal_folder(path: str | Path) -> bool:
    config = Path(path) / "config.json"
    try:
        return config.is_file() and "causal" in json.loads(config.read_text())
    except (OSError, ValueError):
        return False


def load_causal_checkpoint(folder: str | Path, device: torch.device | str = "cpu",
                           dtype: torch.dtype = torch.float32) -> CausalModel:
    folder = Path(folder)
    if not is_causal_folder(folder) or not (folder / "model.safetensors").is_file():
        raise ModelNotFoundError(f"{folder} is not a causal video checkpoint (config.json with a 'causal' "
                                 "section and model.safetensors)")
    spec = json.loads((folder / "config.json").read_text())["causal"]
    model = CausalWan(CausalWanConfig.from_dict(spec["model"]))
    load_weights(model, load_file(str(folder / "model.safetensors")), str(folder))
    text = spec.get("text", {})
    if text.get("kind", "hash") != "hash":
        raise StreamStudioError(f"{folder}: text encoder {text.get('kind')!r} is not one a project checkpoint has")
    encoder = wan.HashTextEmbedder(int(text.get("dim", model.cfg.text_dim)), int(text.get("length", 8)))
    return CausalModel(model.to(device, dtype).eval(), encoder, PixelCodec(), dict(spec.get("sampling", {})))


# ------------------------------------------------------------------------------ released generators


def family_of(name: str) -> str:
    """The family a checkpoint's name or path says (self_forcing when it says none)."""
    low = name.lower().replace("-", "").replace("_", "")
    if "streamdiffusionv2" in low or "v2v" in low:
        return "streamdiffusionv2"
    if "causvid" in low or "autoregressivecheckpoint" in low:
        return "causvid"
    return "self_forcing"


def resolve_generator(spec: str) -> tuple[Path, str]:
    """A file, or a hub id (with an optional :file), -> (local file, family)."""
    path = Path(spec)
    if path.is_file():
        return path, family_of(str(path))
    repo, _, name = spec.partition(":")
    file, family = HUB_FILES.get(repo, (name, family_of(repo)))
    if not file:
        raise ModelNotFoundError(f"{spec!r} is neither a file nor a hub id this loader knows "
                                 f"({', '.join(HUB_FILES)}); give REPO:FILE")
    local = hub.fetch_file(repo, name or file)
    return Path(local), family


def load_released(spec: str, base: str | None, device: torch.device | str, dtype: torch.dtype,
                  taehv: str | Path | None = None) -> CausalModel:
    """A released causal generator with the Wan base model's text encoder and VAE; with `taehv` (a
    taew2_1 .pth / .safetensors file) TAEHV encodes and decodes instead of the VAE (models/video/taehv.py)."""
    tiny = tae.load_taehv(taehv, device) if taehv else None  # (first: a missing file says so before the GBs load)
    path, family = resolve_generator(spec)
    state = generator_state(torch.load(path, map_location="cpu", weights_only=True))
    cfg = config_for(state)
    model = CausalWan(cfg)
    load_weights(model, state, str(path))
    pieces = wan.load_wan_pieces(base or wan.WAN_1_3B, device, dtype)
    sampling = dict(FAMILIES[family], height=60, width=104)  # 480x832, the models' training size
    codec = tiny.stream() if tiny else pieces.codec.stream()
    return CausalModel(model.to(device, dtype).eval(), pieces.text_encoder, codec, sampling,
                       temporal=pieces.codec.temporal, family=family)
