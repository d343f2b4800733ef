"""Users' own LoRAs on a loaded model, changeable while a stream runs.

`--lora PATH_OR_ID[:scale]` (repeatable) names a LoRA: a `.safetensors` file, a folder or hub
repo holding `pytorch_lora_weights.safetensors`, in diffusers/peft or kohya (A1111) layout,
for SD 1.5 / 2.1 or SDXL. `LoraSet` loads them through diffusers' LoRA loader into the UNet
(and the text encoders when the LoRA has weights for them) as named peft adapters, and then:

- `fuse=True` (default, for speed): the adapters' low-rank products are merged into the
  weights (peft's merge), so a frame costs what the base model costs.
- `set_scale`, `add`, `remove` at run time: the merged weights are put back from a copy of
  the base weights taken before the first merge (exactly, not by subtracting the product
  again: a slider dragged a hundred times in float16 would otherwise drift), the adapters'
  scales are set, and the non-zero ones merged again. The base model is never reloaded.
- removing the last LoRA unloads the adapters (the layers are plain again) and leaves the
  base weights bit for bit as they were.

`version` counts changes and `text_version` changes of what the text encoders compute (the
prompt encoder encodes again when it moves); `identity()` names the fused LoRAs and scales for
compiled-engine cache keys (a TensorRT engine holds the weights: a change means a rebuild).
"""

from __future__ import annotations

import logging
import math
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any
import copy

import torch
from diffusers import UNet2DConditionModel
from peft import LoraConfig
from peft.tuners.lora import LoraLayer
from peft.tuners.tuners_utils import BaseTunerLayer
from peft.utils import get_peft_model_state_dict

from streamstudio.errors import ModelNotFoundError, StreamStudioError
from streamstudio.models.hub import cached_file, download_command, hub_id, hub_off, looks_like_path
from streamstudio.models.image.tiny import redraw_parameters

log = logging.getLogger(__name__)

LORA_FILE = "pytorch_lora_weights.safetensors"  # diffusers' name of a LoRA in a folder or hub repo


@dataclass(frozen=True)
class LoraSpec:
    """One LoRA a user asked for: where it is and how strongly it applies."""

    source: str  # a .safetensors file, a folder, or a hub id
    scale: float = 1.0


def split_scale(text: str, flag: str = "--lora", form: str = "PATH_OR_ID[:scale]") -> tuple[str, float]:
    """`PATH_OR_ID[:scale]` -> (source, scale), scale 1 when not given: a trailing `:number` is
    the scale, any other colon belongs to the path (the one parser of --lora, --controlnet,
    --ip-adapter)."""
    text = text.strip()
    source, scale = text, 1.0
    head, sep, tail = text.rpartition(":")
    if sep:
        try:
            scale = float(tail)
            source = head
        except ValueError:
            pass
    if not source:
        raise StreamStudioError(f"{flag} needs a path or hub id, got {text!r} ({form})")
    return source, check_scale(scale)


def parse_lora(text: str) -> LoraSpec:
    """`PATH_OR_ID[:scale]` -> LoraSpec."""
    return LoraSpec(*split_scale(text))


def check_scale(scale) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or abs(scale) > 10:
        raise StreamStudioError(f"a scale must be a number in [-10, 10], got {scale!r}")
    return float(scale)


@dataclass
class LoadedLora:
    name: str  # the peft adapter name
    source: str
    scale: float
    touches_text: bool  # the LoRA has text-encoder weights


class LoraSet:
    """The LoRAs on one model's components (an `SDComponents`: SD 1.5 / 2.1, or SDXL when it
    has `text_encoder_2`). Changes act in place on the components' modules."""

    def __init__(self, comps, fuse: bool = True, local_files_only: bool | None = None):
        if not isinstance(comps.unet, UNet2DConditionModel):
            raise StreamStudioError(f"LoRAs need a diffusers Stable Diffusion model; {comps.name!r} has its own "
                                    "networks (the built-in model takes no LoRA)")
        self.comps = comps
        self.fuse = fuse
        if local_files_only is None:
            local_files_only = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
        self.local_files_only = local_files_only
        self.loras: list[LoadedLora] = []
        self.version = 0
        self.text_version = 0
        self._base: dict[torch.nn.Module, dict[str, torch.Tensor]] = {}  # base weights of merged layers (CPU)
        self._pipe = None

    # ------------------------------------------------------------------ what is loaded
    @property
    def is_sdxl(self) -> bool:
        return getattr(self.comps, "text_encoder_2", None) is not None

    def listing(self) -> list[tuple[str, float]]:
        """(source, scale) of each loaded LoRA, in load order: what the UI lists."""
        return [(lora.source, lora.scale) for lora in self.loras]

    def identity(self) -> str:
        """The fused LoRAs and their scales, for an engine cache key ('' when none is fused)."""
        if not self.fuse:
            return ""
        return ";".join(f"{_source_identity(lora.source)}*{lora.scale:g}" for lora in self.loras if lora.scale != 0)

    def find(self, name_or_source: str) -> LoadedLora:
        for lora in self.loras:
            if name_or_source in (lora.name, lora.source):
                return lora
        raise StreamStudioError(f"no LoRA {name_or_source!r} is loaded; loaded: "
                                f"{', '.join(lora.source for lora in self.loras) or 'none'}")

    # ------------------------------------------------------------------ changes
    def add(self, spec: LoraSpec | str) -> LoadedLora:
        """Load one LoRA as a new adapter and apply the set."""
        spec = parse_lora(spec) if isinstance(spec, str) else LoraSpec(spec.source, check_scale(spec.scale))
        hub = _hub_location(spec.source, self.local_files_only)  # a hub id: cached, or the hub answers, or say so now
        name = self._new_name(spec.source)
        pipe = self._pipeline()
        self._unmerge()
        text_before = self._text_adapters()
        try:
            with warnings.catch_warnings():  # peft warns that a second adapter is a second adapter
                warnings.filterwarnings("ignore", message=".*Already found a `peft_config`.*")
                where, kwargs, local = hub or (*_lora_location(spec.source, self.local_files_only),
                                               self.local_files_only)
                pipe.load_lora_weights(where, adapter_name=name, local_files_only=local, **kwargs)
        except Exception as exc:  # hub, file and key-conversion errors: all mean "cannot load this LoRA"
            self._drop_if_partial(name)
            self._apply()
            if isinstance(exc, (OSError, EnvironmentError)) and not Path(spec.source).exists():
                raise ModelNotFoundError(f"LoRA {spec.source!r} could not be loaded ({_first_line(exc)}); give a "
                                         f".safetensors file, a folder with {LORA_FILE}, or a hub id (fetch it once "
                                         f"with `hf download {spec.source}`)") from exc
            raise StreamStudioError(f"LoRA {spec.source!r} could not be loaded: {_first_line(exc)}") from exc
        if name not in self._unet_adapters():
            self._drop_if_partial(name)
            self._apply()
            kind = "SDXL" if self.is_sdxl else "SD 1.5 / 2.1"
            raise StreamStudioError(f"LoRA {spec.source!r} has no weights for this model's UNet ({kind}); is it "
                                    "made for another model family?")
        lora = LoadedLora(name, spec.source, spec.scale, touches_text=name in self._text_adapters() - text_before)
        self.loras.append(lora)
        self._apply()
        self._changed(lora.touches_text)
        return lora

    def remove(self, name_or_source: str) -> None:
        """Remove one LoRA; with none left, the base weights are back bit for bit."""
        lora = self.find(name_or_source)
        self._unmerge()
        self._pipeline().delete_adapters(lora.name)
        self.loras.remove(lora)
        self._apply()
        self._changed(lora.touches_text)

    def set_scale(self, name_or_source: str, scale: float) -> None:
        lora = self.find(name_or_source)
        scale = check_scale(scale)
        if scale == lora.scale:
            return
        lora.scale = scale
        self._unmerge()
        self._apply()
        self._changed(lora.touches_text)

    def clear(self) -> None:
        for lora in list(self.loras):
            self.remove(lora.name)

    # ------------------------------------------------------------------ internals
    def _changed(self, text: bool) -> None:
        self.version += 1
        if text:
            self.text_version += 1

    def _new_name(self, source: str) -> str:
        stem = Path(source.rstrip("/")).name
        stem = stem[: -len(".safetensors")] if stem.endswith(".safetensors") else stem
        base = re.sub(r"[^A-Za-z0-9_]", "_", stem) or "lora"
        taken = {lora.name for lora in self.loras}
        name, i = base, 2
        while name in taken:
            name, i = f"{base}_{i}", i + 1
        return name

    def _modules(self) -> list[torch.nn.Module]:
        mods = [self.comps.unet, self.comps.text_encoder]
        if self.is_sdxl:
            mods.append(self.comps.text_encoder_2)
        return [m for m in mods if m is not None]

    def _pipeline(self):
        """A diffusers pipeline around the components' own modules (no copies): its LoRA loader
        converts every LoRA layout and places the adapters."""
        if self._pipe is not None:
            return self._pipe
        from diffusers import LCMScheduler, StableDiffusionPipeline, StableDiffusionXLPipeline

        c = self.comps
        scheduler = LCMScheduler.from_config(c.scheduler_config)
        if self.is_sdxl:
            self._pipe = StableDiffusionXLPipeline(vae=None, text_encoder=c.text_encoder,
                                                   text_encoder_2=c.text_encoder_2, tokenizer=c.tokenizer,
                                                   tokenizer_2=c.tokenizer_2, unet=c.unet, scheduler=scheduler)
        else:
            self._pipe = StableDiffusionPipeline(vae=None, text_encoder=c.text_encoder, tokenizer=c.tokenizer,
                                                 unet=c.unet, scheduler=scheduler, safety_checker=None,
                                                 feature_extractor=None, requires_safety_checker=False)
        return self._pipe

    def _lora_layers(self):
        for module in self._modules():
            for layer in module.modules():
                if isinstance(layer, BaseTunerLayer):
                    yield layer

    def _unet_adapters(self) -> set[str]:
        from peft.tuners.lora import LoraLayer  # (the tuner layers a LoRA makes)

        return {name for m in self.comps.unet.modules() if isinstance(m, LoraLayer) for name in m.lora_A}

    def _text_adapters(self) -> set[str]:
        encoders = [self.comps.text_encoder] + ([self.comps.text_encoder_2] if self.is_sdxl else [])
        return {name for enc in encoders if enc is not None for m in enc.modules() if isinstance(m, LoraLayer)
                for name in m.lora_A}

    def _drop_if_partial(self, name: str) -> None:
        if name in self._unet_adapters() | self._text_adapters():
            self._pipeline().delete_adapters(name)

    def _unmerge(self) -> None:
        """Put the base weights back into every merged layer (exactly, from the copies)."""
        for layer in self._lora_layers():
            if layer.merged:
                base = layer.get_base_layer()
                for pname, saved in self._base[layer].items():
                    getattr(base, pname).data.copy_(saved)
                layer.merged_adapters.clear()

    def _apply(self) -> None:
        """The loaded LoRAs at their scales: merged (fuse) or in the forward pass; nothing left
        loaded: the adapters unloaded, the layers plain."""
        pipe = self._pipeline()
        if not self.loras:
            if any(True for _ in self._lora_layers()):
                pipe.unload_lora_weights()
            self._base.clear()
            return
        pipe.set_adapters([lora.name for lora in self.loras], [lora.scale for lora in self.loras])
        if not self.fuse:
            return
        active = [lora.name for lora in self.loras if lora.scale != 0]
        for layer in self._lora_layers():
            names = [n for n in active if n in layer.lora_A]
            if not names:
                continue
            if layer not in self._base:
                base = layer.get_base_layer()
                self._base[layer] = {p: getattr(base, p).detach().to("cpu", copy=True)
                                     for p in ("weight", "bias") if getattr(base, p, None) is not None}
            layer.merge(adapter_names=names)


def _lora_location(source: str, local_files_only: bool) -> tuple[str, dict]:
    """(path or id, keyword arguments) for diffusers' loader: a file is itself; a folder's one
    .safetensors file (or pytorch_lora_weights.safetensors among several) is named; offline, a
    hub id's file must be named too (diffusers cannot list the repo): the standard name."""
    path = Path(os.path.expanduser(source))
    if path.is_file():
        if path.suffix != ".safetensors":
            raise StreamStudioError(f"LoRA {source!r} is not a .safetensors file; StreamStudio loads LoRAs from "
                                    ".safetensors only (nothing is unpickled)")
        return str(path), {}
    if path.is_dir():
        files = sorted(f.name for f in path.glob("*.safetensors"))
        name = LORA_FILE if LORA_FILE in files or len(files) != 1 else files[0]
        return str(path), {"weight_name": name}
    return source, ({"weight_name": LORA_FILE} if local_files_only else {})


def _hub_location(source: str, local_files_only: bool) -> tuple[str, dict, bool] | None:
    """For a hub id: (its cached file or the id, keyword arguments, local_files_only) from
    `lora_source` (below), which fails at once, in one line, when the hub is off or cannot
    be reached (no minute of huggingface_hub's retries); None for a file or folder."""
    if Path(os.path.expanduser(source)).exists() or looks_like_path(source):
        return None
    return lora_source(source, local_files_only, what=f"LoRA {source!r}")


def _source_identity(source: str) -> str:
    path = Path(os.path.expanduser(source))
    if path.exists():
        target = path / LORA_FILE if path.is_dir() else path
        try:
            st = target.stat()
            return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"
        except OSError:
            return str(path.resolve())
    return source


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def save_random_lora(comps, folder: str | os.PathLike, rank: int = 4, alpha: float | None = None, seed: int = 0,
                     text: bool = False, file_name: str | None = None):
    """Write a LoRA of random low-rank weights for `comps`' UNet (and text encoder) into
    `folder`, in diffusers' layout with its adapter configs in the metadata, as diffusers'
    training scripts save them; for tests and benchmarks. Returns (path, unet, text_encoder):
    peft-wrapped copies with the LoRA active, the reference of what loading it must give."""
    from diffusers import StableDiffusionPipeline

    unet, text_encoder = copy.deepcopy(comps.unet), copy.deepcopy(comps.text_encoder)
    config: dict[str, Any] = dict(r=rank, lora_alpha=alpha or rank, init_lora_weights=False)
    with torch.random.fork_rng(devices=[]):
        unet.add_adapter(LoraConfig(target_modules=["to_q", "to_k", "to_v", "to_out.0"], **config))
        if text:
            text_encoder.add_adapter(LoraConfig(target_modules=["q_proj", "k_proj", "v_proj", "out_proj"], **config))
    is_lora = lambda name: "lora_" in name  # noqa: E731  the adapters' weights from `seed` alone
    redraw_parameters(unet, seed, is_lora)
    if text:
        redraw_parameters(text_encoder, seed + 1, is_lora)
    StableDiffusionPipeline.save_lora_weights(
        folder, unet_lora_layers=get_peft_model_state_dict(unet), safe_serialization=True, weight_name=file_name,
        text_encoder_lora_layers=get_peft_model_state_dict(text_encoder) if text else None,
        unet_lora_adapter_metadata=unet.peft_config["default"].to_dict(),
        text_encoder_lora_adapter_metadata=text_encoder.peft_config["default"].to_dict() if text else None)
    return Path(folder) / (file_name or LORA_FILE), unet, text_encoder


def lora_source(source: str, local_files_only: bool, what: str | None = None,
                instead: str = "or give a .safetensors file or a folder holding pytorch_lora_weights.safetensors"
                ) -> tuple[str, dict, bool]:
    """Where diffusers' LoRA loader finds `source`: (path or hub id, keyword arguments,
    local_files_only). A file is itself, a folder names its LoRA file (models/image/lora.py); a hub id
    is its cached file when the cache holds it (no request), the id when the hub answers, and
    otherwise a one-line ModelNotFoundError at once, with the command that fetches it and
    `instead` (what else the user can do)."""
    what = what or f"LoRA {source!r}"
    path = Path(os.path.expanduser(source))
    if path.exists():
        where, kwargs = _lora_location(source, True)
        return where, kwargs, True
    if looks_like_path(source):
        raise ModelNotFoundError(f"{what}: no such file or folder; give a .safetensors file, a folder holding "
                                 f"{LORA_FILE}, a hub id (owner/name), or none")
    repo = hub_id(source, kind="LoRA")
    cached = cached_file(repo, LORA_FILE)
    if cached is not None:
        return str(cached), {}, True
    reason = hub_off(local_files_only)
    if reason:
        raise ModelNotFoundError(f"{what} is not in the local Hugging Face cache and {reason}: run "
                                 f"`{download_command(repo)}` where the hub can be reached, {instead}.")
    return repo, {}, False
