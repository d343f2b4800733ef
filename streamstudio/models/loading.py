"""Load Stable Diffusion components: from a hub id, a local diffusers folder, one
`.safetensors` file, or the built-in `tiny` model.

Weights load through diffusers / transformers / safetensors only: nothing a user supplies
is ever unpickled.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from streamstudio.errors import ModelNotFoundError, StreamStudioError
from streamstudio.models import tiny

log = logging.getLogger(__name__)

DEFAULT_MODEL = "stabilityai/sd-turbo"
LCM_LORA_SD15 = "latent-consistency/lcm-lora-sdv1-5"
TAESD_SD = "madebyollin/taesd"
SINGLE_FILE_KEY = "streamstudio"  # safetensors metadata key of this project's single-file format


@dataclass
class SDComponents:
    """The networks of one Stable Diffusion model and what the pipeline must know of it."""

    unet: torch.nn.Module
    vae: torch.nn.Module  # AutoencoderKL, or AutoencoderTiny when the fast VAE is used
    text_encoder: torch.nn.Module
    tokenizer: object
    scheduler_config: dict
    name: str
    step_type: str = "lcm"  # "lcm" (c_skip, c_out) or "turbo" (x0 = F)
    is_demo: bool = False  # the built-in tiny model, random weights
    notes: list[str] = field(default_factory=list)

    @property
    def prediction_type(self) -> str:
        return self.scheduler_config.get("prediction_type", "epsilon")

    @property
    def vae_scale_factor(self) -> int:
        return 2 ** (len(self.vae.config.block_out_channels) - 1) if hasattr(self.vae.config, "block_out_channels") else 8

    def to(self, device: torch.device, dtype: torch.dtype) -> "SDComponents":
        for module in (self.unet, self.vae, self.text_encoder):
            if next(module.parameters()).dtype != dtype:
                module.to(dtype=dtype)
            module.to(device=device)
        tune_for_device(self, torch.device(device))
        return self


def tune_for_device(comps: "SDComponents", device: torch.device) -> None:
    """On a GPU: the UNet and the VAE in channels_last (cuDNN's fast NHWC convolutions; the
    inputs stay NCHW, convolutions convert them) and cudnn.benchmark on (the streams' shapes
    are fixed, so the autotuned algorithm is chosen once per shape). Nothing on the CPU."""
    if device.type != "cuda":
        return
    torch.backends.cudnn.benchmark = True
    for module in (comps.unet, comps.vae):
        module.to(memory_format=torch.channels_last)


def model_step_type(name: str) -> str:
    """sd-turbo style models (x0 = F) by name; every other model takes the LCM step."""
    return "turbo" if "turbo" in name.lower() else "lcm"


def download_command(model: str) -> str:
    """The command that fetches `model` into the Hugging Face cache (huggingface_hub's `hf` CLI;
    `huggingface-cli` is deprecated and no longer works in the installed huggingface_hub)."""
    return f"hf download {model}"


def _missing(model: str, why: str) -> ModelNotFoundError:
    return ModelNotFoundError(
        f"model {model!r} could not be loaded: {why}. "
        f"To get it, run `{download_command(model)}` on a machine with network access "
        f"(it lands in the Hugging Face cache, ~/.cache/huggingface), or pass --model with a local "
        f"diffusers folder or a .safetensors file; `--model tiny` runs the built-in demo model."
    )


def load_components(
    model: str = DEFAULT_MODEL,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    lcm_lora: str | None = "auto",
    taesd: str | bool | None = None,
    local_files_only: bool | None = None,
) -> SDComponents:
    """Load a model's components onto `device` in `dtype`.

    model: "tiny", a hub id (default sd-turbo), a diffusers folder or a .safetensors file.
    lcm_lora: "auto" fuses LCM-LoRA into SD 1.5 models that are not LCM or turbo already;
      None or "none" never; any other value is a LoRA hub id or path to fuse.
    taesd: True (or "auto") for madebyollin/taesd, a hub id / folder of an AutoencoderTiny,
      or None for the model's own VAE.
    """
    device = torch.device(device)
    if local_files_only is None:
        local_files_only = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    if model == tiny.TINY_NAME:
        parts = tiny.tiny_components(taesd=bool(taesd))
        comps = SDComponents(parts["unet"], parts["taesd"] or parts["vae"], parts["text_encoder"],
                             parts["tokenizer"], parts["scheduler_config"], tiny.TINY_NAME,
                             step_type="lcm", is_demo=True)
        return comps.to(device, dtype)

    with _quiet_hub():
        comps = _load(model, lcm_lora, taesd, local_files_only)
    return comps.to(device, dtype)


@contextlib.contextmanager
def _quiet_hub():
    """diffusers still passes huggingface_hub an argument it has deprecated, and every command
    printed the hub's warning about it: not the user's to act on."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*local_dir_use_symlinks.*", category=UserWarning)
        yield


def _load(model: str, lcm_lora, taesd, local_files_only: bool) -> SDComponents:
    path = Path(os.path.expanduser(model))
    if path.is_dir():
        comps = _load_folder(str(path), model, local_files_only=True)
    elif path.is_file() and path.suffix == ".safetensors":
        comps = _load_single_file(path, local_files_only)
    elif path.exists():
        raise StreamStudioError(f"model {model!r} is a file but not a .safetensors file; "
                                "give a diffusers folder, a .safetensors file or a hub id")
    elif model.endswith(".safetensors") or model.startswith((".", "/", "~")) or model.count("/") > 1:
        raise _missing(model, "no such file or folder")
    else:
        comps = _load_folder(model, model, local_files_only=local_files_only)

    if lcm_lora not in (None, "none"):
        _maybe_fuse_lcm_lora(comps, lcm_lora, local_files_only)
    if taesd:
        comps.vae = _load_taesd(TAESD_SD if taesd in (True, "auto") else str(taesd), local_files_only)
        comps.notes.append("fast VAE: TAESD")
    return comps


def _load_folder(source: str, model: str, local_files_only: bool) -> SDComponents:
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTokenizer

    try:
        kw = dict(local_files_only=local_files_only)
        unet = UNet2DConditionModel.from_pretrained(source, subfolder="unet", **kw)
        vae = AutoencoderKL.from_pretrained(source, subfolder="vae", **kw)
        text_encoder = CLIPTextModel.from_pretrained(source, subfolder="text_encoder", **kw)
        tokenizer = CLIPTokenizer.from_pretrained(source, subfolder="tokenizer", **kw)
        scheduler_config = _read_scheduler_config(source, local_files_only)
    except (OSError, ValueError, EnvironmentError) as exc:  # hub errors are OSError subclasses
        raise _missing(model, _first_line(exc)) from exc
    for module in (unet, vae, text_encoder):
        module.eval().requires_grad_(False)
    return SDComponents(unet, vae, text_encoder, tokenizer, scheduler_config, model,
                        step_type=model_step_type(model))


def _read_scheduler_config(source: str, local_files_only: bool) -> dict:
    from diffusers import LCMScheduler

    try:
        return dict(LCMScheduler.load_config(source, subfolder="scheduler", local_files_only=local_files_only))
    except (OSError, ValueError):
        log.warning("no scheduler config in %s; using the standard Stable Diffusion schedule", source)
        return dict(tiny.SCHEDULER_CONFIG)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# ---------------------------------------------------------------------------------------------
# Single .safetensors files
# ---------------------------------------------------------------------------------------------

def save_single_file(comps: SDComponents, path: str | os.PathLike) -> Path:
    """Write all components into one .safetensors file (this project's layout: prefixed
    diffusers keys, configs and tokenizer files in the header metadata)."""
    from safetensors.torch import save_file

    tensors = {}
    for prefix, module in (("unet", comps.unet), ("vae", comps.vae), ("text_encoder", comps.text_encoder)):
        for key, value in module.state_dict().items():
            tensors[f"{prefix}.{key}"] = value.detach().to("cpu").contiguous()
    with tempfile.TemporaryDirectory() as tmp:
        comps.tokenizer.save_pretrained(tmp)
        tokenizer_files = {f.name: f.read_text(encoding="utf-8") for f in Path(tmp).iterdir() if f.is_file()}
    meta = dict(
        unet=dict(comps.unet.config), vae=dict(comps.vae.config), vae_class=type(comps.vae).__name__,
        text_encoder=comps.text_encoder.config.to_dict(), scheduler=comps.scheduler_config,
        tokenizer=tokenizer_files, name=comps.name,
    )
    path = Path(path)
    save_file(tensors, str(path), metadata={SINGLE_FILE_KEY: json.dumps(meta, default=list)})
    return path


def _load_single_file(path: Path, local_files_only: bool) -> SDComponents:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = (f.metadata() or {}).get(SINGLE_FILE_KEY)
            has_tensors = bool(list(f.keys()))
    except (SafetensorError, OSError, ValueError) as exc:
        raise _not_safetensors(path, exc) from exc
    if not has_tensors:
        raise StreamStudioError(f"{path} holds no weights (a .safetensors file without tensors); "
                                "give a model's .safetensors file, a diffusers folder or a hub id")
    if meta is None:
        return _load_original_single_file(path, local_files_only)
    try:
        meta = json.loads(meta)
        if not isinstance(meta, dict):
            raise ValueError("its metadata is not a mapping")
        return _load_own_single_file(path, meta)
    except StreamStudioError:
        raise
    except (SafetensorError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StreamStudioError(f"{path} is a damaged StreamStudio single-file model ({type(exc).__name__}: "
                                f"{_first_line(exc)}); save it again with save_single_file, or give another "
                                "model") from exc


def _not_safetensors(path: Path, exc: BaseException) -> StreamStudioError:
    return StreamStudioError(f"{path} is not a valid .safetensors file: {_first_line(exc)}; give a model's "
                             ".safetensors file (it may be truncated or damaged), a diffusers folder or a hub id")


def _load_own_single_file(path: Path, meta: dict) -> SDComponents:
    import diffusers
    from diffusers import UNet2DConditionModel
    from safetensors.torch import load_file
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    state = load_file(str(path))
    unet = UNet2DConditionModel.from_config(meta["unet"])
    vae = getattr(diffusers, meta.get("vae_class", "AutoencoderKL")).from_config(meta["vae"])
    text_encoder = CLIPTextModel(CLIPTextConfig.from_dict(meta["text_encoder"]))
    for prefix, module in (("unet", unet), ("vae", vae), ("text_encoder", text_encoder)):
        sub = {k[len(prefix) + 1:]: v for k, v in state.items() if k.startswith(prefix + ".")}
        missing, unexpected = module.load_state_dict(sub, strict=False)
        missing = [k for k in missing if "position_ids" not in k]
        if missing or unexpected:
            raise StreamStudioError(f"{path}: the {prefix} weights do not match their config "
                                    f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
        module.eval().requires_grad_(False)
    with tempfile.TemporaryDirectory() as tok_dir:
        for name, text in meta["tokenizer"].items():
            Path(tok_dir, Path(name).name).write_text(text, encoding="utf-8")
        tokenizer = CLIPTokenizer.from_pretrained(tok_dir)
    name = str(path)
    return SDComponents(unet, vae, text_encoder, tokenizer, dict(meta["scheduler"]), name,
                        step_type=model_step_type(meta.get("name", name)),
                        is_demo=meta.get("name") == tiny.TINY_NAME)


def _load_original_single_file(path: Path, local_files_only: bool) -> SDComponents:
    """An original-layout (CompVis / A1111) checkpoint, through diffusers' single-file loader."""
    from diffusers import StableDiffusionPipeline

    try:
        pipe = StableDiffusionPipeline.from_single_file(str(path), local_files_only=local_files_only,
                                                        safety_checker=None)
    except Exception as exc:  # diffusers raises many types here; all mean "cannot load this file"
        raise _missing(str(path), "diffusers' single-file loader failed (" + _first_line(exc) + "); it needs "
                       "the base model's config from the hub once, or convert the file to a diffusers folder") from exc
    return SDComponents(pipe.unet.eval(), pipe.vae.eval(), pipe.text_encoder.eval(), pipe.tokenizer,
                        dict(pipe.scheduler.config), str(path), step_type=model_step_type(path.name))


# ---------------------------------------------------------------------------------------------
# LCM-LoRA and TAESD
# ---------------------------------------------------------------------------------------------

def is_sd15(comps: SDComponents) -> bool:
    return getattr(comps.unet.config, "cross_attention_dim", None) == 768


def _maybe_fuse_lcm_lora(comps: SDComponents, lcm_lora: str, local_files_only: bool) -> None:
    if lcm_lora == "auto":
        if not is_sd15(comps) or comps.step_type == "turbo" or "lcm" in comps.name.lower():
            return
        lcm_lora = LCM_LORA_SD15
    fuse_lora(comps, lcm_lora, local_files_only=local_files_only)
    comps.step_type = "lcm"
    comps.notes.append(f"LCM-LoRA fused: {lcm_lora}")


def fuse_lora(comps: SDComponents, lora: str, scale: float = 1.0, local_files_only: bool = False) -> None:
    """Fuse a (LCM-)LoRA into the UNet weights, through diffusers' LoRA loader."""
    from diffusers import LCMScheduler, StableDiffusionPipeline

    pipe = StableDiffusionPipeline(vae=comps.vae, text_encoder=comps.text_encoder, tokenizer=comps.tokenizer,
                                   unet=comps.unet, scheduler=LCMScheduler.from_config(comps.scheduler_config),
                                   safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    try:
        pipe.load_lora_weights(lora, local_files_only=local_files_only)
    except Exception as exc:
        raise _missing(lora, "the LoRA could not be loaded (" + _first_line(exc) + ")") from exc
    pipe.fuse_lora(lora_scale=scale)
    pipe.unload_lora_weights()
    comps.unet = pipe.unet


def _load_taesd(source: str, local_files_only: bool):
    from diffusers import AutoencoderTiny

    try:
        vae = AutoencoderTiny.from_pretrained(source, local_files_only=local_files_only or os.path.isdir(source))
    except (OSError, ValueError) as exc:
        raise _missing(source, _first_line(exc)) from exc
    return vae.eval().requires_grad_(False)


def resolve_demo_default(model: str, **kwargs) -> SDComponents:
    """`auto`: the real default (sd-turbo) when its weights are at hand, else the tiny demo
    model with a plain notice. Any other name loads exactly that model or fails clearly."""
    if model != "auto":
        return load_components(model, **kwargs)
    try:
        return load_components(DEFAULT_MODEL, local_files_only=True, **kwargs)
    except ModelNotFoundError:
        comps = load_components(tiny.TINY_NAME, **{k: v for k, v in kwargs.items() if k in ("device", "dtype")})
        comps.notes.append(DEMO_NOTICE)
        log.debug(DEMO_NOTICE)
        return comps


DEMO_NOTICE = (
    f"Running the built-in demo model ('tiny', random weights: its images are noise-like patterns) "
    f"because {DEFAULT_MODEL} is not in the local cache. For real images run "
    f"`{download_command(DEFAULT_MODEL)}` once with network access, or pass --model with a "
    f"diffusers folder or a .safetensors checkpoint."
)
