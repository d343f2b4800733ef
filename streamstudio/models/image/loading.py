"""Load Stable Diffusion components (SD 1.5 / 2.1 and SDXL): from a hub id, a local diffusers
folder, one `.safetensors` file, the built-in image model `builtin` (trained here, shipped in
`assets/image_builtin/`), or the random-weight `tiny` / `tiny-sdxl` test models.

Weights load through diffusers / transformers / safetensors only: nothing a user supplies
is ever unpickled.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from diffusers import AutoencoderKL, AutoencoderTiny, LCMScheduler, UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer
import diffusers

from streamstudio import ASSETS
from streamstudio.errors import ModelNotFoundError, StreamStudioError
from streamstudio.models.image import builtin_image, sdxl, tiny
from streamstudio.models.hub import (DEFAULT_MODEL, HUB_PROBE_TIMEOUT, LCM_LORA_SD15, SHORT_NAMES,  # noqa: F401
                                     TAESD_SD, cached_file, cached_snapshot, download_command, download_model,
                                     hub_cache_dir, hub_download_size, hub_id, hub_repo_source, hub_unreachable)
from streamstudio.models.hub import first_line as _first_line
from streamstudio.models.hub import hub_off as _hub_off
from streamstudio.models.hub import looks_like_path as _looks_like_path
from streamstudio.models.hub import not_cached as _not_cached
from streamstudio.models.hub import offline as _offline
from streamstudio.models.hub import quiet_hub  # noqa: F401 (loading.quiet_hub: callers of old)
from streamstudio.models.image.components import SDComponents
from streamstudio.models.image.lora import lora_source

log = logging.getLogger(__name__)

SINGLE_FILE_KEY = "streamstudio"  # safetensors metadata key of this project's single-file format


def model_step_type(name: str) -> str:
    """sd-turbo style models (x0 = F) by name; every other model takes the LCM step."""
    return "turbo" if "turbo" in name.lower() else "lcm"


def _missing(model: str, why: str) -> ModelNotFoundError:
    return ModelNotFoundError(
        f"model {model!r} could not be loaded: {why}. "
        f"To get it, run `{download_command(model)}` on a machine with network access "
        f"(it lands in the Hugging Face cache, ~/.cache/huggingface), or pass --model with a local "
        f"diffusers folder or a .safetensors file; `--model builtin` runs the small built-in model."
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

    model: "builtin", "tiny", "tiny-sdxl", a hub id (default sd-turbo), a diffusers folder, a
      train-image checkpoint folder or a .safetensors file (SD 1.5 / 2.1 or SDXL).
    lcm_lora (the CLI's --lcm-lora): "auto" fuses LCM-LoRA (latent-consistency/lcm-lora-sdv1-5 or
      -sdxl, from the Hugging Face cache or the hub) into SD 1.5 and SDXL models that are not LCM
      or turbo already; None or "none" never (the model runs as it is, with a note that few steps
      give poor images); any other value is a LoRA to fuse whatever the model: a local
      .safetensors file, a folder holding pytorch_lora_weights.safetensors, or a hub id.
      When auto needs the hub and it is off or unreachable, ModelNotFoundError at once naming
      `--lcm-lora PATH` and `--lcm-lora none`.
    A hub id is owner/name; well-known short names (sd-turbo, sdxl-turbo, ...: SHORT_NAMES) stand
    for their full ids. A hub model (or add-on) not in the local cache is fetched only when the hub
    answers one request within HUB_PROBE_TIMEOUT seconds; otherwise (or with HF_HUB_OFFLINE) a
    one-line ModelNotFoundError says at once which repository to fetch and the command.
    taesd: True (or "auto") for madebyollin/taesd (madebyollin/taesdxl for SDXL), a hub id /
      folder of an AutoencoderTiny, or None for the model's own VAE.
    SDXL in float16 with its own VAE: madebyollin/sdxl-vae-fp16-fix when it can be had, else
    the VAE stays in float32 (`vae_upcast`), with a note.
    """
    device = torch.device(device)
    if local_files_only is None:
        local_files_only = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    if model == tiny.TINY_NAME:
        parts = tiny.tiny_components(taesd=bool(taesd))
        comps = SDComponents(parts["unet"], parts["taesd"] or parts["vae"], parts["text_encoder"],
                             parts["tokenizer"], parts["scheduler_config"], tiny.TINY_NAME,
                             step_type="lcm", is_demo=True, default_size=64)
        _maybe_fuse_lcm_lora(comps, lcm_lora, local_files_only)  # only a named one: auto skips demo models
        return comps.to(device, dtype)
    if model == sdxl.TINY_SDXL_NAME:
        parts = sdxl.tiny_sdxl_components(taesd=bool(taesd))
        comps = SDComponents(parts["unet"], parts["taesd"] or parts["vae"], parts["text_encoder"],
                             parts["tokenizer"], parts["scheduler_config"], sdxl.TINY_SDXL_NAME, step_type="lcm",
                             is_demo=True, default_size=64, text_encoder_2=parts["text_encoder_2"],
                             tokenizer_2=parts["tokenizer_2"])
        _maybe_fuse_lcm_lora(comps, lcm_lora, local_files_only)
        return comps.to(device, dtype)
    if model == BUILTIN_NAME or _is_builtin_folder(model):
        comps = load_builtin(None if model == BUILTIN_NAME else model)
        if taesd:
            comps.notes.append("--taesd does nothing for the built-in model: its own autoencoder is faster still")
        if _lcm_lora_choice(lcm_lora) not in (None, "auto"):
            comps.notes.append("--lcm-lora does nothing for the built-in model: it has its own networks and "
                               "takes its one-step update already")
        return comps.to(device, dtype)

    with quiet_hub():
        comps = _load(model, lcm_lora, taesd, local_files_only)
        if comps.is_sdxl and dtype == torch.float16:
            _sdxl_fp16_vae(comps, local_files_only)
    return comps.to(device, dtype)


def _load(model: str, lcm_lora, taesd, local_files_only: bool) -> SDComponents:
    path = Path(os.path.expanduser(model))
    if path.is_dir():
        comps = _load_folder(str(path), model, local_files_only=True)
    elif path.is_file() and path.suffix == ".safetensors":
        comps = _load_single_file(path, local_files_only)
    elif path.exists():
        raise StreamStudioError(f"model {model!r} is a file but not a .safetensors file; "
                                "give a diffusers folder, a .safetensors file or a hub id")
    elif _looks_like_path(model):
        raise _missing(model, "no such file or folder")
    else:
        comps = _load_hub_model(model, local_files_only)

    _maybe_fuse_lcm_lora(comps, lcm_lora, local_files_only)
    if taesd:
        default = sdxl.TAESD_SDXL if comps.is_sdxl else TAESD_SD
        comps.vae = _load_taesd(default if taesd in (True, "auto") else str(taesd), local_files_only)
        comps.notes.append("fast VAE: TAESDXL" if comps.is_sdxl else "fast VAE: TAESD")
    return comps


def _load_hub_model(model: str, local_files_only: bool) -> SDComponents:
    """A hub model: its snapshot in the local cache when there is one (no request at all), else
    fetched when the hub answers; else a one-line error at once, naming the full repository id
    and the command that fetches it (no minute of huggingface_hub's retries first)."""
    repo = hub_id(model)
    snapshot = cached_snapshot(repo, "unet/config.json")
    if snapshot is not None:
        try:
            return _load_folder(str(snapshot), repo, local_files_only=True)
        except ModelNotFoundError:  # only part of it is in the cache: fetch the rest when the hub answers
            if _hub_off(local_files_only):
                raise
            log.info("%s is only partly in the local cache; fetching the rest", repo)
    else:
        reason = _hub_off(local_files_only)
        if reason:
            raise _not_cached(model, repo, reason)
    return _load_folder(repo, repo, local_files_only=False)


def _load_folder(source: str, model: str, local_files_only: bool) -> SDComponents:
    text_encoder_2 = tokenizer_2 = None
    try:
        local = local_files_only
        unet = UNet2DConditionModel.from_pretrained(source, subfolder="unet", local_files_only=local)
        vae = AutoencoderKL.from_pretrained(source, subfolder="vae", local_files_only=local)
        text_encoder = CLIPTextModel.from_pretrained(source, subfolder="text_encoder", local_files_only=local)
        tokenizer = CLIPTokenizer.from_pretrained(source, subfolder="tokenizer", local_files_only=local)
        if sdxl.is_sdxl_unet(unet):  # SDXL: the second, projecting text encoder
            text_encoder_2 = CLIPTextModelWithProjection.from_pretrained(source, subfolder="text_encoder_2",
                                                                         local_files_only=local)
            tokenizer_2 = CLIPTokenizer.from_pretrained(source, subfolder="tokenizer_2", local_files_only=local)
            text_encoder_2.eval().requires_grad_(False)
        scheduler_config = _read_scheduler_config(source, local_files_only)
    except (OSError, ValueError, EnvironmentError) as exc:  # hub errors are OSError subclasses
        raise _missing(model, _first_line(exc)) from exc
    for module in (unet, vae, text_encoder):
        module.eval().requires_grad_(False)
    return SDComponents(unet, vae, text_encoder, tokenizer, scheduler_config, model,
                        step_type=model_step_type(model), text_encoder_2=text_encoder_2, tokenizer_2=tokenizer_2,
                        default_size=sdxl.default_size(model) if text_encoder_2 is not None else None)


def _read_scheduler_config(source: str, local_files_only: bool) -> dict:
    try:
        return dict(LCMScheduler.load_config(source, subfolder="scheduler", local_files_only=local_files_only))
    except (OSError, ValueError):
        log.warning("no scheduler config in %s; using the standard Stable Diffusion schedule", source)
        return dict(tiny.SCHEDULER_CONFIG)


# ---------------------------------------------------------------------------------------------
# Single .safetensors files
# ---------------------------------------------------------------------------------------------

def save_single_file(comps: SDComponents, path: str | os.PathLike) -> Path:
    """Write all components into one .safetensors file (this project's layout: prefixed
    diffusers keys, configs and tokenizer files in the header metadata)."""
    tensors = {}
    for prefix, module in _single_file_modules(comps):
        for key, value in module.state_dict().items():
            tensors[f"{prefix}.{key}"] = value.detach().to("cpu").contiguous()
    meta = dict(
        unet=dict(comps.unet.config), vae=dict(comps.vae.config), vae_class=type(comps.vae).__name__,
        text_encoder=comps.text_encoder.config.to_dict(), scheduler=comps.scheduler_config,
        tokenizer=_tokenizer_files(comps.tokenizer), name=comps.name,
    )
    if comps.text_encoder_2 is not None:  # SDXL
        meta.update(text_encoder_2=comps.text_encoder_2.config.to_dict(),
                    tokenizer_2=_tokenizer_files(comps.tokenizer_2))
    path = Path(path)
    save_file(tensors, str(path), metadata={SINGLE_FILE_KEY: json.dumps(meta, default=list)})
    return path


def _single_file_modules(comps: SDComponents) -> list[tuple[str, torch.nn.Module]]:
    mods = [("unet", comps.unet), ("vae", comps.vae), ("text_encoder", comps.text_encoder)]
    return mods + ([("text_encoder_2", comps.text_encoder_2)] if comps.text_encoder_2 is not None else [])


def _tokenizer_files(tokenizer) -> dict[str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        return {f.name: f.read_text(encoding="utf-8") for f in Path(tmp).iterdir() if f.is_file()}


def _tokenizer_from_files(files: dict[str, str]):
    with tempfile.TemporaryDirectory() as tok_dir:
        for name, text in files.items():
            Path(tok_dir, Path(name).name).write_text(text, encoding="utf-8")
        return CLIPTokenizer.from_pretrained(tok_dir)


def _load_single_file(path: Path, local_files_only: bool) -> SDComponents:
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
    state = load_file(str(path))
    unet = UNet2DConditionModel.from_config(meta["unet"])
    vae = getattr(diffusers, meta.get("vae_class", "AutoencoderKL")).from_config(meta["vae"])
    text_encoder = CLIPTextModel(CLIPTextConfig.from_dict(meta["text_encoder"]))
    modules = [("unet", unet), ("vae", vae), ("text_encoder", text_encoder)]
    text_encoder_2 = tokenizer_2 = None
    if "text_encoder_2" in meta:  # SDXL
        text_encoder_2 = CLIPTextModelWithProjection(CLIPTextConfig.from_dict(meta["text_encoder_2"]))
        tokenizer_2 = _tokenizer_from_files(meta["tokenizer_2"])
        modules.append(("text_encoder_2", text_encoder_2))
    for prefix, module in modules:
        sub = {k[len(prefix) + 1:]: v for k, v in state.items() if k.startswith(prefix + ".")}
        missing, unexpected = module.load_state_dict(sub, strict=False)
        missing = [k for k in missing if "position_ids" not in k]
        if missing or unexpected:
            raise StreamStudioError(f"{path}: the {prefix} weights do not match their config "
                                    f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
        module.eval().requires_grad_(False)
    tokenizer = _tokenizer_from_files(meta["tokenizer"])
    name = str(path)
    saved = meta.get("name", name)
    demo = saved in (tiny.TINY_NAME, sdxl.TINY_SDXL_NAME)
    return SDComponents(unet, vae, text_encoder, tokenizer, dict(meta["scheduler"]), name,
                        step_type=model_step_type(saved), is_demo=demo,
                        text_encoder_2=text_encoder_2, tokenizer_2=tokenizer_2,
                        default_size=(64 if demo else sdxl.default_size(saved)) if text_encoder_2 is not None else None)


SDXL_ORIGINAL_KEY = "conditioner.embedders.1.model.ln_final.weight"  # SDXL's second (OpenCLIP) text encoder


def is_original_sdxl_file(path: Path) -> bool:
    """An original-layout (Stability / A1111) SDXL checkpoint: it has SDXL's second text encoder."""
    with safe_open(str(path), framework="pt") as f:
        return SDXL_ORIGINAL_KEY in set(f.keys())


def _load_original_single_file(path: Path, local_files_only: bool) -> SDComponents:
    """An original-layout (CompVis / A1111 / Stability) checkpoint, SD or SDXL, through
    diffusers' single-file loader."""
    from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline

    is_xl = is_original_sdxl_file(path)
    try:
        if is_xl:
            pipe = StableDiffusionXLPipeline.from_single_file(str(path), local_files_only=local_files_only)
        else:
            pipe = StableDiffusionPipeline.from_single_file(str(path), local_files_only=local_files_only,
                                                            safety_checker=None)
    except Exception as exc:  # diffusers raises many types here; all mean "cannot load this file"
        raise _missing(str(path), "diffusers' single-file loader failed (" + _first_line(exc) + "); it needs "
                       "the base model's config from the hub once, or convert the file to a diffusers folder") from exc
    extra = dict(text_encoder_2=pipe.text_encoder_2.eval(), tokenizer_2=pipe.tokenizer_2,
                 default_size=sdxl.default_size(path.name)) if is_xl else {}
    return SDComponents(pipe.unet.eval(), pipe.vae.eval(), pipe.text_encoder.eval(), pipe.tokenizer,
                        dict(pipe.scheduler.config), str(path), step_type=model_step_type(path.name), **extra)


# ---------------------------------------------------------------------------------------------
# LCM-LoRA and TAESD
# ---------------------------------------------------------------------------------------------

def is_sd15(comps: SDComponents) -> bool:
    return getattr(comps.unet.config, "cross_attention_dim", None) == 768


def _lcm_lora_choice(lcm_lora) -> str | None:
    """None (no LCM-LoRA), "auto", or the LoRA a user named (a path or hub id)."""
    if lcm_lora is None or str(lcm_lora).strip().lower() in ("", "none", "off"):
        return None
    text = str(lcm_lora).strip()
    return "auto" if text.lower() == "auto" else text


def wants_lcm_lora(comps: SDComponents) -> bool:
    """Whether `--lcm-lora auto` fuses LCM-LoRA into this model: SD 1.5 or SDXL, not a turbo or
    LCM model already, not a built-in demo model."""
    return (is_sd15(comps) or comps.is_sdxl) and comps.step_type != "turbo" and "lcm" not in comps.name.lower() \
        and not comps.is_demo


LCM_LORA_INSTEAD = ("give a local copy with `--lcm-lora PATH` (a .safetensors file, or a folder holding "
                    "pytorch_lora_weights.safetensors), or run the model as it is with `--lcm-lora none` "
                    "(few steps then give poor images)")


def _maybe_fuse_lcm_lora(comps: SDComponents, lcm_lora, local_files_only: bool) -> None:
    choice = _lcm_lora_choice(lcm_lora)
    if choice is None:
        if wants_lcm_lora(comps):
            # The step stays "lcm" and is right for the plain model too: at every timestep of the
            # 50-step schedule (19 to 999) its boundary scalings are c_skip < 7e-6, c_out > 0.99999,
            # i.e. the plain x0 estimate any epsilon/v model gives (DDIM's). What the model lacks
            # without LCM-LoRA is the training that makes that estimate good in a few steps.
            comps.notes.append(f"no LCM-LoRA (--lcm-lora none): {comps.name} is not a few-step model, so at the "
                               "1-4 steps of a live stream its images are blurry and unfinished; more steps "
                               "(--steps, up to 50) help, LCM-LoRA helps most")
        return
    if choice == "auto":
        if not wants_lcm_lora(comps):
            return
        source = sdxl.LCM_LORA_SDXL if comps.is_sdxl else LCM_LORA_SD15
        family = "SDXL" if comps.is_sdxl else "SD 1.5"
        where, kwargs, local = lora_source(
            source, local_files_only, what=f"the LCM-LoRA {source} (fused by default into {family} models that are "
                                           "not LCM or turbo, for few-step sampling)", instead=LCM_LORA_INSTEAD)
    else:
        source = choice
        where, kwargs, local = lora_source(source, local_files_only, what=f"the LCM-LoRA {source!r} (--lcm-lora)",
                                           instead=LCM_LORA_INSTEAD.replace("give a local copy", "give a local file"))
    _fuse(comps, where, kwargs, local, 1.0, source)
    comps.step_type = "lcm"
    comps.notes.append(f"LCM-LoRA fused: {source}")


def fuse_lora(comps: SDComponents, lora: str, scale: float = 1.0, local_files_only: bool = False) -> None:
    """Fuse a (LCM-)LoRA (a .safetensors file, a folder holding one, or a hub id) into the UNet
    weights for good, through diffusers' LoRA loader (users' LoRAs, changeable at run time, are
    `models/image/lora.LoraSet`'s)."""
    where, kwargs, local = lora_source(lora, local_files_only)
    _fuse(comps, where, kwargs, local, scale, lora)


def _fuse(comps: SDComponents, where: str, kwargs: dict, local_files_only: bool, scale: float, label: str) -> None:
    # (the pipelines by their modules: diffusers' top-level names are dummies to a type checker)
    from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion import StableDiffusionPipeline
    from diffusers.pipelines.stable_diffusion_xl.pipeline_stable_diffusion_xl import StableDiffusionXLPipeline

    scheduler = LCMScheduler.from_config(comps.scheduler_config)
    # (diffusers' annotations ask for every part; its pipelines take None for those LoRA loading never uses)
    pipe: StableDiffusionPipeline | StableDiffusionXLPipeline
    if comps.is_sdxl:
        assert comps.text_encoder_2 is not None and comps.tokenizer_2 is not None  # (SDXL's second encoder)
        pipe = StableDiffusionXLPipeline(text_encoder=comps.text_encoder, text_encoder_2=comps.text_encoder_2,
                                         tokenizer=comps.tokenizer, tokenizer_2=comps.tokenizer_2, unet=comps.unet,
                                         scheduler=scheduler, vae=None)  # type: ignore[arg-type]
    else:
        pipe = StableDiffusionPipeline(text_encoder=comps.text_encoder, tokenizer=comps.tokenizer, unet=comps.unet,
                                       scheduler=scheduler, requires_safety_checker=False,
                                       vae=None, safety_checker=None, feature_extractor=None)  # type: ignore[arg-type]
    try:
        pipe.load_lora_weights(where, local_files_only=local_files_only, **kwargs)
    except Exception as exc:
        raise _missing(label, "the LoRA could not be loaded (" + _first_line(exc) + ")") from exc
    pipe.fuse_lora(lora_scale=scale)
    pipe.unload_lora_weights()
    comps.unet = pipe.unet


def _sdxl_fp16_vae(comps: SDComponents, local_files_only: bool) -> None:
    """SDXL's own VAE overflows in float16 (NaN images): the fp16-fix VAE when it can be had
    (from the cache, or the hub when it answers), else the model's VAE kept in float32."""
    if not isinstance(comps.vae, AutoencoderKL) or not getattr(comps.vae.config, "force_upcast", False):
        return  # TAESDXL, or a VAE that says it runs in float16
    local = Path(os.path.expanduser(sdxl.VAE_FP16_FIX))
    snapshot = local if local.is_dir() else cached_snapshot(sdxl.VAE_FP16_FIX, "config.json")
    reason = None if snapshot is not None else _hub_off(local_files_only)
    try:
        if reason:
            raise OSError(f"it is not in the local cache and {reason}")
        source = str(snapshot) if snapshot is not None else sdxl.VAE_FP16_FIX
        vae = AutoencoderKL.from_pretrained(source, local_files_only=snapshot is not None)
    except (OSError, ValueError) as exc:
        comps.vae_upcast = True
        comps.notes.append(f"VAE kept in float32: SDXL's VAE overflows in float16 and {sdxl.VAE_FP16_FIX} could not "
                           f"be loaded ({_first_line(exc)}); `{download_command(sdxl.VAE_FP16_FIX)}` makes it faster")
        return
    comps.vae = vae.eval().requires_grad_(False)
    comps.notes.append(f"float16 VAE: {sdxl.VAE_FP16_FIX}")


def _load_taesd(source: str, local_files_only: bool):
    local = os.path.isdir(os.path.expanduser(source))
    where = os.path.expanduser(source) if local else source
    if not local:
        if _looks_like_path(source):
            raise _missing(source, "no such folder (--taesd takes a hub id or a folder of an AutoencoderTiny)")
        repo = hub_id(source, kind="TAESD")
        snapshot = cached_snapshot(repo, "config.json")
        if snapshot is not None:
            where, local = str(snapshot), True
        else:
            reason = _hub_off(local_files_only)
            if reason:
                raise ModelNotFoundError(f"the fast VAE {repo} (--taesd) is not in the local Hugging Face cache and "
                                         f"{reason}: run `{download_command(repo)}` where the hub can be reached, "
                                         "or leave out --taesd.")
            where = repo
    try:
        vae = AutoencoderTiny.from_pretrained(where, local_files_only=local)
    except (OSError, ValueError) as exc:
        raise _missing(source, _first_line(exc)) from exc
    return vae.eval().requires_grad_(False)


# ---------------------------------------------------------------------------------------------
# The built-in image model
# ---------------------------------------------------------------------------------------------

BUILTIN_NAME = "builtin"
BUILTIN_DIR = ASSETS / "image_builtin"


def _is_builtin_folder(model: str) -> bool:
    """A `train-image` checkpoint folder (config.json naming the builtin model + model.safetensors)."""
    path = Path(os.path.expanduser(model))
    try:
        return (path / "model.safetensors").is_file() and \
            json.loads((path / "config.json").read_text()).get("name") == BUILTIN_NAME
    except (OSError, ValueError, AttributeError):
        return False


def load_builtin(folder: str | os.PathLike | None = None) -> SDComponents:
    """The built-in image model (assets/image_builtin, or a `train-image` checkpoint folder): a
    pixel-shuffle autoencoder, a small UNet taking sd-turbo's one-step x0 update, and its own
    word-level tokenizer and text encoder; 256x256 by default."""
    path = BUILTIN_DIR if folder is None else Path(os.path.expanduser(str(folder)))
    if not (path / "model.safetensors").is_file() or not (path / "config.json").is_file():
        raise ModelNotFoundError(
            f"the built-in image model is missing from {path} (model.safetensors and config.json); reinstall "
            "streamstudio, or train one with `streamstudio train-image --output DIR` and pass --model DIR")
    try:
        info = json.loads((path / "config.json").read_text())
        parts = builtin_image.build(info["model"])
        builtin_image.load_state(parts, load_file(str(path / "model.safetensors")))
    except (SafetensorError, OSError, ValueError, KeyError, TypeError) as exc:
        raise StreamStudioError(f"the built-in image model in {path} is damaged ({type(exc).__name__}: "
                                f"{_first_line(exc)}); reinstall streamstudio or train it again with "
                                "`streamstudio train-image`") from exc
    for name in ("unet", "vae", "text_encoder"):
        parts[name].eval().requires_grad_(False)
    name = BUILTIN_NAME if folder is None else str(path)
    return SDComponents(parts["unet"], parts["vae"], parts["text_encoder"], parts["tokenizer"],
                        dict(info.get("scheduler", tiny.SCHEDULER_CONFIG)), name,
                        step_type=info.get("step_type", "turbo"), is_demo=True,
                        default_size=int(info.get("default_size", 256)))


# ---------------------------------------------------------------------------------------------
# --model auto
# ---------------------------------------------------------------------------------------------

# what diffusers reads of sd-turbo (fp32 weights; the fp16 variants are not fetched)
SD_TURBO_FILES = ["model_index.json", "scheduler/*.json", "tokenizer/*", "text_encoder/config.json",
                  "text_encoder/model.safetensors", "unet/config.json", "unet/diffusion_pytorch_model.safetensors",
                  "vae/config.json", "vae/diffusion_pytorch_model.safetensors"]


def _has_cuda(device) -> bool:
    if device is not None and torch.device(device).type != "cuda":
        return False
    return torch.cuda.is_available()


def resolve_demo_default(model: str, **kwargs) -> SDComponents:
    """`auto`: with a CUDA GPU, sd-turbo (from the cache, or downloaded once when the hub can be
    reached, after a one-line notice of its size); without a GPU (where sd-turbo takes seconds per
    frame), offline, or when the download fails, the built-in image model with a notice saying
    so. Any other name loads exactly that model or fails clearly."""
    if model != "auto":
        return load_components(model, **kwargs)
    if not _has_cuda(kwargs.get("device")):
        return _builtin_instead("there is no CUDA GPU here (on a CPU, sd-turbo takes seconds per frame; "
                                f"`--model {DEFAULT_MODEL}` runs it anyway)", kwargs)
    try:
        return load_components(DEFAULT_MODEL, local_files_only=True, **kwargs)
    except ModelNotFoundError:
        pass
    if _offline():
        return _builtin_instead(f"{DEFAULT_MODEL} is not in the local cache and the hub is off (HF_HUB_OFFLINE)",
                                kwargs)
    # the probe first: bounded, even for DNS
    size = None if hub_unreachable() else hub_download_size(DEFAULT_MODEL, SD_TURBO_FILES)
    if size is None:
        return _builtin_instead(f"{DEFAULT_MODEL} is not in the local cache and the Hugging Face hub cannot be "
                                "reached", kwargs)
    log.warning("Downloading %s (%.1f GB) into the Hugging Face cache; this happens once.", DEFAULT_MODEL, size / 1e9)
    try:
        download_model(DEFAULT_MODEL, SD_TURBO_FILES)
        return load_components(DEFAULT_MODEL, local_files_only=True, **kwargs)
    except Exception as exc:  # a failed or interrupted download: say so and run the built-in model
        if isinstance(exc, KeyboardInterrupt):
            raise
        return _builtin_instead(f"downloading {DEFAULT_MODEL} failed ({_first_line(exc)})", kwargs)


def _builtin_instead(reason: str, kwargs: dict) -> SDComponents:
    basic = {k: v for k, v in kwargs.items() if k in ("device", "dtype")}
    try:
        comps = load_components(BUILTIN_NAME, **basic)
    except StreamStudioError as exc:  # the asset is missing or damaged: the random-weight model still runs
        log.warning("%s", exc)
        comps = load_components(tiny.TINY_NAME, **basic)
    notice = demo_notice(reason, comps.name)
    comps.notes.append(notice)
    log.debug(notice)
    return comps


DEMO_NOTICE = (
    f"For real images use a CUDA GPU with `--model {DEFAULT_MODEL}` (run `{download_command(DEFAULT_MODEL)}` "
    f"once with network access), or pass --model with a diffusers folder or a .safetensors checkpoint."
)


def demo_notice(reason: str, name: str = BUILTIN_NAME) -> str:
    """The one-line notice that a built-in model runs instead of a real one, why, and what to do."""
    if name == tiny.TINY_NAME:
        what = "the random-weight test model ('tiny': its images are noise-like patterns)"
    else:
        what = ("the small built-in image model ('builtin', trained on procedural images: it keeps the input's "
                "structure and applies the colours, gradings and simple styles a prompt names, at 256x256)")
    return f"Running {what} because {reason}. {DEMO_NOTICE}"
