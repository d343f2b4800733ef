"""The engine cache: one file per (model identity, shape profile, precision, TensorRT version,
GPU), so that changing any of them builds a new engine instead of loading a wrong one.

Layout of a cache folder:
    <name>-<digest>.engine   the serialized engine
    <name>-<digest>.json     its key in full (checked again on load)
    onnx/<name>-<model id>/model.onnx   the exported network (reused across precisions and GPUs)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)

Profile = dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]  # input -> (min, opt, max)


def _config_json(module: nn.Module) -> str:
    config = getattr(module, "config", None)
    if config is None:
        config = getattr(module, "cfg", None)
    if config is None:
        return "{}"
    if hasattr(config, "to_dict"):
        config = config.to_dict()
    elif hasattr(config, "__dataclass_fields__"):
        config = asdict(config)
    try:  # private keys (_name_or_path, _diffusers_version, ...) do not change the network
        config = {k: v for k, v in dict(config).items() if not str(k).startswith("_")}
    except (TypeError, ValueError):
        config = {"repr": repr(config)}
    return json.dumps(config, sort_keys=True, default=str)


def model_identity(module: nn.Module) -> str:
    """Hash of a module's class, config, and every parameter and buffer (names, dtypes,
    shapes and bytes). Any change of weights (a fused LoRA too) or config changes it."""
    h = hashlib.sha256()
    h.update(f"{type(module).__module__}.{type(module).__qualname__}".encode())
    h.update(_config_json(module).encode())
    for name, tensor in module.state_dict().items():
        t = tensor.detach()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        if t.numel():
            h.update(t.contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:32]


def gpu_identity(device: torch.device | int | None = None) -> str:
    """The GPU's name and compute capability ("cpu" without one)."""
    if not torch.cuda.is_available():
        return "cpu"
    index = torch.device(device).index if isinstance(device, torch.device) else device
    index = torch.cuda.current_device() if index is None else index
    major, minor = torch.cuda.get_device_capability(index)
    return f"{torch.cuda.get_device_name(index)} sm_{major}{minor}"


@dataclass(frozen=True)
class EngineKey:
    name: str  # "unet", "vae_encoder", "vae_decoder", "video"
    model_id: str  # model_identity() of the source module
    profile: tuple  # ((input, min shape, opt shape, max shape), ...), sorted by input
    precision: str  # "fp16" or "fp32"
    trt_version: str
    gpu: str  # gpu_identity()
    extra: tuple = field(default_factory=tuple)  # anything else that shapes the engine (sorted pairs)

    @staticmethod
    def make(name: str, model_id: str, profile: Profile, precision: str, trt_version: str, gpu: str,
             **extra: object) -> "EngineKey":
        prof = tuple(sorted((k, tuple(v[0]), tuple(v[1]), tuple(v[2])) for k, v in profile.items()))
        return EngineKey(name, model_id, prof, precision, trt_version, gpu, tuple(sorted(extra.items())))

    def to_json(self) -> dict:
        return json.loads(json.dumps(asdict(self)))  # tuples -> lists, comparable with a file

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()[:24]

    def filename(self) -> str:
        return f"{self.name}-{self.digest()}.engine"

    def profile_dict(self) -> Profile:
        return {k: (tuple(lo), tuple(opt), tuple(hi)) for k, lo, opt, hi in self.profile}

    def with_(self, **changes: Any) -> "EngineKey":
        return replace(self, **changes)


def default_cache_dir() -> Path:
    root = os.environ.get("STREAMSTUDIO_ENGINE_DIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                                       "streamstudio", "engines")
    return Path(root)


class EngineCache:
    """Engines and ONNX files in one folder, looked up by `EngineKey`."""

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else default_cache_dir()

    def engine_path(self, key: EngineKey) -> Path:
        return self.root / key.filename()

    def onnx_path(self, name: str, model_id: str) -> Path:
        return self.root / "onnx" / f"{name}-{model_id}" / "model.onnx"

    def lookup(self, key: EngineKey) -> Path | None:
        """The engine file for exactly this key, or None (a missing or mismatched key file
        counts as no engine)."""
        path = self.engine_path(key)
        meta = path.with_suffix(".json")
        if not path.is_file() or not meta.is_file():
            return None
        try:
            stored = json.loads(meta.read_text())
        except (OSError, ValueError):
            return None
        if stored != key.to_json():
            log.warning("engine %s has a key file that does not match; rebuilding", path.name)
            return None
        return path

    def store(self, key: EngineKey, engine_bytes: bytes) -> Path:
        """Write the engine and its key (the key last, so a half-written engine is never found)."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.engine_path(key)
        tmp = path.with_suffix(".engine.tmp")
        tmp.write_bytes(engine_bytes)
        os.replace(tmp, path)
        path.with_suffix(".json").write_text(json.dumps(key.to_json(), indent=1, sort_keys=True))
        return path

    def entries(self) -> list[dict]:
        """The key of every engine in the folder."""
        out = []
        for meta in sorted(self.root.glob("*.json")):
            try:
                out.append({"file": meta.with_suffix(".engine").name, **json.loads(meta.read_text())})
            except (OSError, ValueError):
                continue
        return out
