"""Two decks (issue 48): while a web stream plays (deck A), a second model is loaded beside it
(deck B), warmed on the stream's own frames, then switched to by a cut (at once, or on the next
beat of the tempo clock, app/perform/tempo.py) or a pixel cross-fade over N seconds.

Deck B is a model with, optionally, its own prompt, its own add-ons (LoRAs, ControlNets, an
IP-Adapter: an `Addons` as a stream's request has, loaded by the one `add_addons` of
app/streams/image.py into deck B's own copy of the model; the IP-Adapter's reference is the
`ip_image` file or the stream's newest frame) and its own output size (`DeckSpec`), or a model
of the video pipeline (`"pipeline": "video"`: image -> video, app/web/video_deck.py; it gives
frames late, so it is ready, and a switch asked for meanwhile lands, at its first frame).

A stream's frame step is its session's processor (app/web/sessions.py, `StreamProcessor`). While
a deck is loaded, `DeckProcessor` takes its place: every input frame goes to A, whose output is
the stream's, and to B, whose output is the deck's preview, so B's Stream Batch buffer is full of
the stream's own frames before it goes on air. Settings applied go to both (B keeps its own
prompt and add-on scales when it joins). Deck B's frames are fitted to the stream's size while
both play (`on_stream`: a fade mixes across sizes); a switch ends with B as the session's
processor, the stream at B's size (`StreamSession.resize`), and A's pipeline (and its model, when
a deck loaded it) released. Every input frame gives exactly one output frame throughout: nothing
dropped, nothing repeated.

Memory is checked before loading (`memory_report`): deck B's weights and its add-ons' (their
files' sizes on disk; parameter count x bytes for the tiny model) against what the device has
free (torch.cuda.mem_get_info on CUDA, psutil's available memory on CPU). The routes are
app/web/deck_routes.py's. A stream playing a video deck takes a deck in turn (video -> image,
or another video model). Not yet (refused with "not yet"): a video deck with add-ons, txt2img
decks, latent cross-fades, `serve --cluster`'s remote replicas (with `serve --gpus`, untested:
deck B would load on the stream's replica's device).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import psutil
import torch

from streamstudio.app.streams.image import add_addons, read_picture
from streamstudio.app.streams.requests import Addons
from streamstudio.app.streams.video import BUILTIN_NAMES as VIDEO_BUILTIN_NAMES
from streamstudio.app.web.sessions import ServerModel, StreamProcessor, StreamSession
from streamstudio.app.web.video_deck import TAKES as VIDEO_TAKES
from streamstudio.app.web.video_deck import VideoDeckProcessor, build_video_deck
from streamstudio.errors import StreamStudioError
from streamstudio.frames import fit
from streamstudio.models.hub import SHORT_NAMES
from streamstudio.models.image import sdxl, tiny
from streamstudio.models.image.controlnet import parse_controlnet
from streamstudio.models.image.ip_adapter import parse_ip_adapter
from streamstudio.models.image.loading import BUILTIN_DIR, BUILTIN_NAME, resolve_demo_default
from streamstudio.models.image.lora import parse_lora
from streamstudio.models.video.stream_dit import BUILTIN_CHECKPOINT
from streamstudio.pipelines.image.control import Preprocessor

log = logging.getLogger(__name__)

HEADROOM = 1.25  # a deck needs its weights and about a quarter more for its work (activations, buffers)
MAX_FADE_S = 60.0
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")
MAX_SIDE = 2048
FIELDS = ("model", "prompt", "negative_prompt", "loras", "controlnets", "control_preprocessors", "ip_adapter",
          "ip_image", "width", "height", "pipeline")
VIDEO_FIELDS = ("model", "prompt", "width", "height", "pipeline")  # a video deck's
PIPELINES = ("image", "video")
NOT_YET = {"mode": "another mode (txt2img)"}
STATES = ("loading", "warming", "ready", "switching", "switched", "error", "unloaded")


class DeckBusy(StreamStudioError):
    """The deck's state does not allow it now (HTTP 409): a second deck B, a switch with no deck
    ready, an unload after the switch, a stream with no frame yet."""


class DeckRefused(StreamStudioError):
    """A deck that does not fit in memory (HTTP 507)."""

    def __init__(self, message: str, memory: dict):
        super().__init__(message)
        self.memory = memory


# ------------------------------------------------------------------ the request and the memory
@dataclass(frozen=True)
class DeckSpec:
    """What deck B is: a model (the names `serve --model` takes), optionally its prompt, its own
    add-ons (LoRAs, ControlNets, an IP-Adapter: the stream's request's `Addons`, loaded by the
    one `add_addons`) and its own output size (None: the stream's)."""

    model: str
    prompt: str | None = None
    negative_prompt: str | None = None
    addons: Addons = field(default_factory=Addons)
    width: int | None = None
    height: int | None = None
    pipeline: str = "image"  # or "video": the StreamDiT video pipeline (app/web/video_deck.py)

    @staticmethod
    def parse(raw: object) -> DeckSpec:
        if not isinstance(raw, dict):
            raise StreamStudioError('a deck is a JSON object {"model": NAME, "prompt": TEXT?, ...}')
        for key in raw:
            if key in NOT_YET:
                raise StreamStudioError(f"not yet: a deck with {NOT_YET[key]} ({key!r}); a deck is a model, a prompt, "
                                        "its add-ons and a size, on the image or the video pipeline, img2img")
        unknown = sorted(set(raw) - set(FIELDS))
        if unknown:
            raise StreamStudioError(f"unknown deck field(s) {', '.join(map(repr, unknown))}: a deck takes "
                                    f"{', '.join(FIELDS)}")
        model = raw.get("model")
        if not isinstance(model, str) or not model.strip():
            raise StreamStudioError('a deck needs "model": a model name as serve --model takes (tiny, builtin, a hub '
                                    'id, a folder or a .safetensors file)')
        for key in ("prompt", "negative_prompt", "ip_adapter", "ip_image"):
            if raw.get(key) is not None and not isinstance(raw[key], str):
                raise StreamStudioError(f"{key} must be a string")
        addons = Addons(loras=_names(raw, "loras"), controlnets=_names(raw, "controlnets"),
                        control_preprocessors=_names(raw, "control_preprocessors"),
                        ip_adapter=raw.get("ip_adapter"), ip_image=raw.get("ip_image"))
        _check_addons(addons)
        pipeline = raw.get("pipeline", "image")
        if pipeline not in PIPELINES:
            raise StreamStudioError(f'pipeline must be "image" or "video", got {pipeline!r}')
        other = sorted(set(raw) - set(VIDEO_FIELDS))
        if pipeline == "video" and other:
            raise StreamStudioError(f"not yet: a video deck with {', '.join(map(repr, other))}; a video deck takes "
                                    f"{', '.join(VIDEO_FIELDS)}")
        return DeckSpec(model.strip(), raw.get("prompt"), raw.get("negative_prompt"), addons,
                        _side(raw, "width"), _side(raw, "height"), pipeline)

    def size(self, stream: tuple[int, int]) -> tuple[int, int]:
        """Deck B's (width, height): its own, each side not given the stream's."""
        return self.width or stream[0], self.height or stream[1]

    @property
    def own_settings(self) -> set[str]:
        """The stream's settings deck B does not take when it joins: its own prompt's, its own add-ons' scales."""
        own = {"prompt"} if self.prompt is not None else set()
        own |= {"negative_prompt"} if self.negative_prompt is not None else set()
        own |= {"lora_scales"} if self.addons.loras else set()
        own |= {"control_scales"} if self.addons.controlnets else set()
        return own | ({"ip_adapter_scale"} if self.addons.ip_adapter else set())


def _names(raw: dict, key: str) -> list[str]:
    """A list of names (PATH_OR_ID[:scale]); one string is a list of one."""
    value = raw.get(key)
    if value is None:
        return []
    value = [value] if isinstance(value, str) else value
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise StreamStudioError(f"{key} must be a list of names (PATH_OR_ID[:scale])")
    return [v.strip() for v in value]


def _side(raw: dict, key: str) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 8 <= value <= MAX_SIDE or value % 8:
        raise StreamStudioError(f"{key} must be a multiple of 8 from 8 to {MAX_SIDE}, got {value!r}")
    return value


def _check_addons(addons: Addons) -> None:
    """The add-ons' names and scales (the command line's parsers), before anything loads."""
    for text in addons.loras:
        parse_lora(text)
    for text in addons.controlnets:
        parse_controlnet(text)
    if len(addons.control_preprocessors) > len(addons.controlnets):
        raise StreamStudioError(f"{len(addons.control_preprocessors)} control_preprocessors for "
                                f"{len(addons.controlnets)} controlnets; give one per ControlNet")
    for kind in addons.control_preprocessors:
        Preprocessor(kind)
    if addons.ip_adapter:
        parse_ip_adapter(addons.ip_adapter)
    elif addons.ip_image:
        raise StreamStudioError("ip_image is the reference of an IP-Adapter: give ip_adapter too")


def loaded_bytes(comps) -> int:
    """The bytes of a loaded model's weights (its networks' parameters and buffers, its
    ControlNets' and its IP-Adapter's image encoder's; LoRAs are fused into the networks)."""
    ip = getattr(comps, "ip_adapter", None)
    modules = [comps.unet, comps.vae, comps.text_encoder, comps.text_encoder_2, *comps.controlnets,
               getattr(ip, "image_encoder", None)]
    seen: set[int] = set()
    total = 0
    for module in modules:
        if not isinstance(module, torch.nn.Module):
            continue
        for t in [*module.parameters(), *module.buffers()]:
            if id(t) not in seen:
                seen.add(id(t))
                total += t.numel() * t.element_size()
    return total


def _files_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))


def _hub_cache_bytes(repo: str) -> int | None:
    from huggingface_hub.constants import HF_HUB_CACHE

    folder = Path(HF_HUB_CACHE) / ("models--" + repo.replace("/", "--")) / "blobs"
    if not folder.is_dir():
        return None
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) or None


def weights_estimate(model: str, dtype: torch.dtype, pipeline: str = "image") -> tuple[int | None, str]:
    """(bytes, how) of `model`'s weights before it loads: its files' sizes on disk (a file, a
    folder, the built-in model, a hub id in the local cache), the tiny models' parameter count x
    the bytes of `dtype`; (None, why) when it cannot be told (a hub id not fetched yet). A video
    model (`pipeline` "video"): the builtin StreamDiT's checkpoint, a folder or a file."""
    if pipeline == "video" and model in VIDEO_BUILTIN_NAMES:
        return _files_bytes(BUILTIN_CHECKPOINT), "files"
    if model in ("tiny", "tiny-sdxl"):
        parts = tiny.tiny_components() if model == "tiny" else sdxl.tiny_sdxl_components()
        count = sum(p.numel() for m in parts.values() if isinstance(m, torch.nn.Module) for p in m.parameters())
        return count * torch.empty((), dtype=dtype).element_size(), "parameters"
    if model == BUILTIN_NAME:
        return (BUILTIN_DIR / "model.safetensors").stat().st_size, "files"
    path = Path(os.path.expanduser(model))
    if path.is_file():
        return path.stat().st_size, "files"
    if path.is_dir():
        return _files_bytes(path), "files"
    size = _hub_cache_bytes(SHORT_NAMES.get(model, model)) if "/" in SHORT_NAMES.get(model, model) else None
    return (size, "files") if size is not None else (None, "unknown: not in the local cache (loading fetches it)")


def addon_estimates(addons: Addons) -> list[dict]:
    """Each add-on's weights before it loads: {"kind", "source", "bytes" (None: not known)}, from
    its files' sizes on disk (an IP-Adapter's with its image_encoder/ beside it) or the hub cache."""
    named = [("lora", parse_lora(t).source) for t in addons.loras]
    named += [("controlnet", parse_controlnet(t).source) for t in addons.controlnets]
    if addons.ip_adapter:
        named.append(("ip_adapter", parse_ip_adapter(addons.ip_adapter).source))
    return [{"kind": kind, "source": source, "bytes": _source_bytes(source, kind == "ip_adapter")}
            for kind, source in named]


def _source_bytes(source: str, with_encoder: bool) -> int | None:
    path = Path(os.path.expanduser(source))
    if path.is_file():
        encoder = path.parent / "image_encoder"
        return path.stat().st_size + (_files_bytes(encoder) if with_encoder and encoder.is_dir() else 0)
    if path.is_dir():
        return _files_bytes(path)
    parts = source.split("/")
    return _hub_cache_bytes("/".join(parts[:2])) if len(parts) >= 2 else None


def available_bytes(device: torch.device) -> int:
    """Memory free for another model on `device`: the GPU's free memory, or the machine's available RAM."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return int(psutil.virtual_memory().available)


@dataclass
class DeckA:
    """What deck B is loaded beside: deck A's device, dtype, model name and the bytes of its weights."""

    device: torch.device
    dtype: torch.dtype
    name: str
    bytes: int

    @classmethod
    def of(cls, processor) -> DeckA:
        """Deck A an image stream (its model's networks) or a video deck on air (its network)."""
        if isinstance(processor, VideoDeckProcessor):
            network = processor.model.network
            param = next(network.parameters())
            return cls(param.device, param.dtype, processor.model.name,
                       sum(t.numel() * t.element_size() for t in network.parameters()))
        comps = processor.model.comps
        unet = next(comps.unet.parameters())
        return cls(unet.device, unet.dtype, comps.name, loaded_bytes(comps))


def memory_report(spec: DeckSpec, a: DeckA) -> dict:
    """Deck A's and deck B's memory (B's model and its add-ons) and what is free, before B loads;
    DeckRefused when B does not fit."""
    device, dtype = a.device, a.dtype
    model_bytes, how = weights_estimate(spec.model, dtype, spec.pipeline)
    addons = addon_estimates(spec.addons)
    known = [model_bytes, *(a["bytes"] for a in addons)]
    b_bytes = None if any(n is None for n in known) else sum(n for n in known if n is not None)
    if any(a["bytes"] is None for a in addons) and model_bytes is not None:
        how = "unknown: an add-on is not in the local cache (loading fetches it)"
    free = available_bytes(torch.device(device))
    a_bytes = a.bytes
    needs = None if b_bytes is None else int(b_bytes * HEADROOM)
    fits = needs is None or needs <= free
    report = {"device": str(device), "available_bytes": free, "deck_a": {"model": a.name, "bytes": a_bytes},
              "deck_b": {"model": spec.model, "bytes": b_bytes, "estimate": how, "model_bytes": model_bytes,
                         "addons": addons}, "needs_bytes": needs, "fits": fits}
    if not fits:
        parts = "" if not addons else f" (model {_gib(model_bytes)}, add-ons {_gib(sum(a['bytes'] for a in addons))})"
        raise DeckRefused(f"deck B ({spec.model}) does not fit: it needs about {_gib(needs)} (weights "
                          f"{_gib(b_bytes)}{parts} + {HEADROOM - 1:.0%} to run) and {_gib(free)} is free on {device} "
                          f"(deck A, {a.name}, holds {_gib(a_bytes)})", report)
    return report


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.2f} GiB"


# ------------------------------------------------------------------ deck B's model and frame step
class DeckStreamProcessor(StreamProcessor):
    """Deck B's frame step: a `StreamProcessor` over a model the deck loaded, which it owns (closed with it)."""

    def close(self) -> None:
        self.model.close()

    def warm(self, frame: np.ndarray) -> np.ndarray:
        """Its frame for `frame` while deck A's is on air."""
        return self(frame)

    def is_ready(self, warmed: int) -> bool:
        """Its Stream Batch buffer holds only the stream's frames after `warmed` of them."""
        assert self.pipe is not None  # (build_deck opened it)
        return warmed > (self.pipe.latency_frames or 0)


def build_deck(spec: DeckSpec, a: StreamProcessor | VideoDeckProcessor, size: tuple[int, int],
               reference: np.ndarray | None = None) -> DeckStreamProcessor:
    """Deck B: `spec`'s model on deck A's device and dtype with `spec`'s add-ons (`add_addons`, as
    a stream's request loads them), its pipeline built at `size` (width, height); `reference`:
    its IP-Adapter's reference picture. Deck A a video deck on air: B takes the image settings the
    stream had before it (the video deck keeps them)."""
    a_model = a.model
    info = DeckA.of(a)
    device, dtype = info.device, info.dtype
    comps = resolve_demo_default(spec.model, device=device, dtype=dtype)
    add_addons(spec.addons, comps, device, dtype)
    base = a_model.config
    config = replace(base, width=size[0], height=size[1])
    if comps.step_type != getattr(a_model.comps, "step_type", None):  # the defaults build_pipeline gives such a model
        turbo = comps.step_type == "turbo"
        config = replace(config, steps=1 if turbo else 2, t_index_list=None, guidance_scale=1.0 if turbo else 1.2)
    model = ServerModel(comps, config.validate(), prompt=a_model.prompt if spec.prompt is None else spec.prompt,
                        negative_prompt=a_model.negative_prompt if spec.negative_prompt is None
                        else spec.negative_prompt, latency_probe=a_model.latency_probe)
    b = DeckStreamProcessor(model, a.mode, a.sid)
    try:
        b.open(size)
        assert b.pipe is not None  # (open built it)
        if reference is not None:  # (the first reference on a model is also its default: B's alone)
            b.pipe.addons.set_reference(reference)
    except BaseException:
        b.close()
        raise
    return b


def deck_reference(spec: DeckSpec, session: StreamSession) -> np.ndarray | None:
    """Deck B's IP-Adapter reference picture: its ip_image file, else the stream's newest frame."""
    if not spec.addons.ip_adapter:
        return None
    if spec.addons.ip_image:
        return read_picture(spec.addons.ip_image, "ip_image")
    if session.last_frame is None:
        raise DeckBusy("deck B's IP-Adapter takes the stream's newest frame as its reference (no ip_image): send "
                       "a frame first")
    return session.last_frame.copy()


# ------------------------------------------------------------------ the switch
@dataclass
class Switch:
    """A switch asked for: a cut or a fade of `seconds`, at once or from the next whole beat."""

    mode: str = "cut"
    seconds: float = 2.0
    on_beat: bool = False
    beat: float | None = None  # the whole beat it waits for (on_beat)
    start: float | None = None  # the time of its first frame (a fade's alpha counts from it)

    @staticmethod
    def parse(raw: object) -> Switch:
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise StreamStudioError('a switch is a JSON object {"mode": "cut"|"fade", "seconds": 2.0, '
                                    '"on_beat": false}')
        unknown = sorted(set(raw) - {"mode", "seconds", "on_beat"})
        if unknown:
            raise StreamStudioError(f"unknown switch field(s) {', '.join(map(repr, unknown))}: mode, seconds, on_beat")
        mode, seconds, on_beat = raw.get("mode", "cut"), raw.get("seconds", 2.0), raw.get("on_beat", False)
        if mode not in ("cut", "fade"):
            raise StreamStudioError(f'mode must be "cut" or "fade", got {mode!r}')
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= MAX_FADE_S:
            raise StreamStudioError(f"seconds must be a number over 0 and at most {MAX_FADE_S:g}, got {seconds!r}")
        if not isinstance(on_beat, bool):
            raise StreamStudioError(f"on_beat must be true or false, got {on_beat!r}")
        return Switch(mode, float(seconds), on_beat)

    def alpha(self, now: float, clock) -> float:
        """Deck B's share of the frame at `now`: 0 before the beat waited for, then 1 (a cut) or
        rising from 0 to 1 over `seconds` (a fade)."""
        if self.beat is not None and clock.beat(now) < self.beat:
            return 0.0
        if self.start is None:
            self.start = now
        if self.mode == "cut":
            return 1.0
        return min(1.0, (now - self.start) / self.seconds)


def on_stream(b: np.ndarray, shape: tuple[int, ...], mode: str) -> np.ndarray:
    """Deck B's frame at the stream's size `shape` (H, W, 3) while both decks play: as is when it
    has it, else cropped or padded to its aspect (the stream's fit) and resized (`frames.fit`)."""
    return b if b.shape == shape else fit(b, shape[1], shape[0], mode)


def crossfade(a: np.ndarray, b: np.ndarray, alpha: float) -> np.ndarray:
    """(1 - alpha) a + alpha b, rounded, as uint8."""
    mixed = a.astype(np.float32) * (1.0 - alpha) + b.astype(np.float32) * alpha
    return np.clip(np.rint(mixed), 0, 255).astype(np.uint8)


@dataclass
class FrameRecord:
    """One output frame of a stream with a deck: its number since the deck was loaded, its time,
    the tempo clock's beat then, and deck B's share of it (0: deck A's, 1: deck B's)."""

    index: int
    t: float
    beat: float | None
    alpha: float
    warmed: bool  # deck B took this frame


class Deck:
    """Deck B of one stream: its state, memory figures, preview, the switch and the frame log."""

    def __init__(self, session: StreamSession, spec: DeckSpec, memory: dict, clock=None,
                 reference: np.ndarray | None = None):
        self.session, self.spec, self.memory, self.clock = session, spec, memory, clock
        self.reference = reference  # deck B's IP-Adapter reference picture
        self.size = spec.size(session.size)  # deck B's (width, height)
        self.state = "loading"  # (STATES)
        self.error: str | None = None
        self.notice: str | None = None  # a setting deck B refused (deck A took it)
        self.a: StreamProcessor | VideoDeckProcessor | None = None
        self.b: DeckStreamProcessor | VideoDeckProcessor | None = None
        self.joined = False
        self.warmed = 0  # frames deck B has taken
        self.preview: np.ndarray | None = None  # deck B's newest output
        self.switch: Switch | None = None
        self.records: list[FrameRecord] = []  # since the deck loaded (bounded)
        self.loaded_at: float | None = None
        self.switched_at: float | None = None
        self.lock = threading.Lock()  # a frame, an unload, the switch's end: one at a time

    def to_json(self) -> dict:
        sw = self.switch
        return {"stream": self.session.sid, "state": self.state, "model": self.spec.model, "prompt": self.spec.prompt,
                "warmed_frames": self.warmed, "error": self.error, "notice": self.notice, "memory": self.memory,
                "switch": None if sw is None else {"mode": sw.mode, "seconds": sw.seconds, "on_beat": sw.on_beat,
                                                   "beat": sw.beat},
                "frames": len(self.records), "preview": self.preview is not None, "size": list(self.size),
                "addons": {"loras": self.spec.addons.loras, "controlnets": self.spec.addons.controlnets,
                           "ip_adapter": self.spec.addons.ip_adapter}}

    def load(self) -> None:
        """Load deck B (the background thread of `POST .../deck`); on success its processor takes
        the session's place; a failure leaves deck A playing and says why in `error`."""
        session = self.session
        a = session.processor
        try:
            if not isinstance(a, (StreamProcessor, VideoDeckProcessor)) or a.pipe is None:
                raise StreamStudioError("the stream has no frame yet: send one before loading a deck")
            self.a = a
            if self.spec.pipeline == "video":
                info = DeckA.of(a)
                self.b = build_video_deck(self.spec.model, self.spec.prompt, a, self.size, info.device, info.dtype)
            else:
                self.b = build_deck(self.spec, a, self.size, self.reference)
        except Exception as exc:  # noqa: BLE001 - a failed load is said in the deck's state; A plays on
            self.state, self.error = "error", f"deck B did not load: {exc}"
            log.warning("stream %s: %s", session.sid, self.error)
            return
        with self.lock:
            if self.state != "loading":  # unloaded meanwhile
                self.b.close()
                return
            self.state, self.loaded_at = "warming", time.monotonic()
            processor = DeckProcessor(self)
            session.processor = session.runner.processor = processor  # the runner calls it from its next frame
        log.info("stream %s: deck B (%s) loaded, warming on the stream's frames", session.sid, self.spec.model)

    def unload(self) -> None:
        """Deck B unloaded, deck A plays on alone (before a switch)."""
        with self.lock:
            if self.state in ("switched", "unloaded"):
                raise DeckBusy(f"nothing to unload: the deck is {self.state}")
            if self.a is not None and self.session.processor is not self.a and self.state != "loading":
                self.session.processor = self.session.runner.processor = self.a
            self.state = "unloaded"
            b, self.b = self.b, None
        if b is not None:
            b.close()

    def ask_switch(self, switch: Switch) -> None:
        with self.lock:
            if self.state not in ("warming", "ready"):
                raise DeckBusy(f"no deck to switch to: the deck is {self.state}"
                                        + (f" ({self.error})" if self.error else ""))
            if switch.on_beat:
                if self.clock is None:
                    raise StreamStudioError("on_beat needs the tempo clock (this server takes no performance input)")
                switch.beat = float(math.floor(self.clock.beat(time.monotonic())) + 1)
            self.switch, self.state = switch, "switching"

    def finish(self) -> None:
        """(In the runner's thread, under the lock) deck B on air alone; deck A released."""
        a, b = self.a, self.b
        assert a is not None and b is not None
        self.session.processor = self.session.runner.processor = b
        self.session.model = b.model
        self.session.resize(self.size)  # (outputs started from now on open at deck B's size)
        self.state, self.switched_at, self.a = "switched", time.monotonic(), None
        self.preview = None
        a.close()  # (a deck's own model is closed with it; the server's shared model stays)
        log.info("stream %s: switched to deck B (%s)", self.session.sid, self.spec.model)

    def record(self, t: float, alpha: float, warmed: bool) -> None:
        beat = None if self.clock is None else self.clock.beat(t)
        self.records.append(FrameRecord(len(self.records), t, beat, alpha, warmed))
        del self.records[:-10000]


class DeckProcessor:
    """A stream's frame step while it has deck B: A's output (or the cross-fade, or B's), B
    warming on the same frame (see the module's docstring); the session's processor meanwhile."""

    def __init__(self, deck: Deck):
        assert deck.a is not None and deck.b is not None
        self.deck, self.a, self.b = deck, deck.a, deck.b
        self.calls = self.a.calls

    @property
    def fit(self) -> str:
        return self.a.fit

    @fit.setter
    def fit(self, value: str) -> None:  # (the settings' "fit" goes through apply)
        self.a.fit = value

    @property
    def pipe(self):
        return self.a.pipe

    @property
    def stats(self):
        return self.a.stats

    @property
    def notice(self) -> str | None:
        return self.deck.notice

    def open(self, size: tuple[int, int]) -> None:
        self.a.open(size)

    def apply(self, changes: dict) -> None:
        """Deck A's settings change (its refusal is the stream's); deck B's too, once it has joined."""
        self.a.apply(changes)
        with self.deck.lock:
            if self.deck.joined and self.deck.b is not None:  # (not unloaded meanwhile)
                self._apply_b(changes)

    def _apply_b(self, changes: dict) -> None:
        try:
            self.b.apply(changes)
        except StreamStudioError as exc:
            self.deck.notice = f"deck B did not take a setting: {exc}"

    def close(self) -> None:
        self.a.close()
        self.b.close()

    def _join(self) -> None:
        """Deck B's first frame: the stream's settings so far (its own prompt and add-on scales kept) and A's fit."""
        settings = dict(getattr(self.deck.session, "_applied", {}))
        for key in {"fit", *self.deck.spec.own_settings}:
            settings.pop(key, None)
        if isinstance(self.b, VideoDeckProcessor):  # (the image table's others are not the video pipeline's)
            settings = {k: v for k, v in settings.items() if k in VIDEO_TAKES}
        self.b.fit = self.a.fit
        if settings:
            self._apply_b(settings)
        self.deck.joined = True

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        deck = self.deck
        with deck.lock:
            if deck.session.processor is not self:  # unloaded or switched meanwhile: this frame is theirs
                return deck.session.processor(frame)
            if not deck.joined:
                self._join()
            out_a = self.a(frame)
            out_b = self.b.warm(frame)  # (None: a video deck not ready yet)
            deck.warmed += 1
            if deck.state == "warming" and self.b.is_ready(deck.warmed):
                deck.state = "ready"  # B's buffer holds only the stream's frames
            now = time.monotonic()
            switch = deck.switch
            alpha = 0.0 if switch is None or out_b is None else switch.alpha(now, deck.clock)
            deck.record(now, alpha, True)
            if out_b is not None and alpha >= 1.0:
                deck.finish()
                return out_b  # (at deck B's size: the stream's from now on)
            deck.preview = deck.preview if out_b is None else out_b
            if alpha <= 0.0 or out_b is None:
                return out_a
            return crossfade(out_a, on_stream(out_b, out_a.shape, self.a.fit), alpha)


def deck_preview(session: StreamSession | None) -> tuple[np.ndarray | None, str]:
    """What the Live tab shows of `session`'s deck B: its newest frame and a line of state
    (None and "" with no deck loaded)."""
    processor = None if session is None else session.processor
    if not isinstance(processor, DeckProcessor):
        return None, ""
    deck = processor.deck
    line = f"Deck B: {deck.spec.model}, {deck.state} ({deck.warmed} frame(s) warmed)"
    return deck.preview, line + (f"; {deck.notice}" if deck.notice else "")


class Decks:
    """The decks of a server's streams, by stream id (the routes' state)."""

    def __init__(self, manager):
        self.manager = manager
        self._decks: dict[str, Deck] = {}
        self._lock = threading.Lock()

    def get(self, sid: str) -> Deck | None:
        with self._lock:
            for gone in [k for k, d in self._decks.items() if self.manager.get(k) is not d.session]:
                self._decks.pop(gone)
            return self._decks.get(sid)

    def load(self, sid: str, spec: DeckSpec, background: bool = True) -> Deck:
        """Start loading deck B for stream `sid`: LookupError without the stream, DeckRefused when
        it does not fit, StreamStudioError when the stream cannot take a deck now."""
        session = self.manager.get(sid)
        if session is None:
            raise LookupError(f"no stream {sid!r}")
        processor, existing = session.processor, self.get(sid)
        if existing is not None and (isinstance(processor, DeckProcessor) or existing.state == "loading"):
            raise DeckBusy(f"stream {sid!r} has a deck B already ({existing.spec.model}, "
                                    f"{existing.state}): switch to it or unload it (DELETE) first")
        if not isinstance(processor, (StreamProcessor, VideoDeckProcessor)):
            raise StreamStudioError("not yet: decks on serve --cluster's remote replicas")
        if processor.pipe is None:
            raise DeckBusy(f"stream {sid!r} has no frame yet: send one before loading a deck")
        reference = deck_reference(spec, session)  # (a picture that cannot be read: refused now)
        memory = memory_report(spec, DeckA.of(processor))
        inputs = getattr(self.manager, "inputs", None)
        deck = Deck(session, spec, memory, getattr(inputs, "clock", None), reference)
        with self._lock:
            self._decks[sid] = deck
        if background:
            threading.Thread(target=deck.load, name=f"deck-{sid}", daemon=True).start()
        else:
            deck.load()
        return deck
