"""The live settings table (`pipelines/live_settings.py`) turned into what each front end takes:
the web API's check (`parse_settings`, also behind OSC and the Live tab), the Live tab's
controls (`live_controls`, `settings_from_ui`) and the command-line flags (`add_setting_flags`;
the render config file is read through those flags). Nothing here declares a setting.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from streamstudio.errors import StreamStudioError
from streamstudio.pipelines import live_settings
from streamstudio.pipelines.live_settings import ADDON_SCALE, MAX_PROMPTS, LiveSetting

_TYPES = {str: (str,), int: (int,), float: (int, float), bool: (bool,)}  # what a JSON client may send


# ---------------------------------------------------------------------------- the web API
def parse_settings(raw: dict) -> dict:
    """Check a settings dict from a client; returns the normalized settings or raises
    StreamStudioError saying which value is wrong and what it may be."""
    if not isinstance(raw, dict):
        raise StreamStudioError("settings must be a JSON object")
    table = {s.name: s for s in live_settings.live_settings()}
    unknown = sorted(set(raw) - set(table) - {CONTROL_SCALES, IP_ADAPTER_SCALE})
    if unknown:
        raise StreamStudioError(f"unknown setting(s) {', '.join(map(str, unknown))}; known: {', '.join(table)}, "
                                f"{CONTROL_SCALES}, {IP_ADAPTER_SCALE}")
    return {key: _parse_control_scales(value) if key == CONTROL_SCALES else _parse_ip_scale(value)
            if key == IP_ADAPTER_SCALE else _parse_one(table[key], value) for key, value in raw.items()}


CONTROL_SCALES = "control_scales"  # a session's ControlNet conditioning scales, one per --controlnet
MAX_CONTROLNETS = 8


def _scale_ok(value) -> bool:
    low, high = ADDON_SCALE.low, ADDON_SCALE.high
    assert low is not None and high is not None  # (the add-on scales' range)
    return not isinstance(value, bool) and isinstance(value, (int, float)) and low <= value <= high


def _parse_control_scales(value) -> list[float]:
    """A list of add-on scales (the table's ADDON_SCALE range), one per ControlNet of the model
    (the stream checks the count); they are the session's own (per-row scales), not the shared model's."""
    if not isinstance(value, (list, tuple)) or not 1 <= len(value) <= MAX_CONTROLNETS or not all(map(_scale_ok, value)):
        raise StreamStudioError(f"{CONTROL_SCALES} is a list of 1 to {MAX_CONTROLNETS} numbers in "
                                f"{ADDON_SCALE.range_words()}, one per ControlNet, e.g. [0.8, 0.5]; got {value!r}")
    return [float(v) for v in value]


IP_ADAPTER_SCALE = "ip_adapter_scale"  # a session's IP-Adapter scale (per row: its own, not the model's)


def _parse_ip_scale(value) -> float:
    if not _scale_ok(value):
        raise StreamStudioError(f"{IP_ADAPTER_SCALE} is a number in {ADDON_SCALE.range_words()}, e.g. 0.6; "
                                f"got {value!r}")
    return float(value)


def _parse_one(setting: LiveSetting, value):
    if setting.name == "prompt" and isinstance(value, (list, tuple)):
        pairs = _parse_blend(value)
        for text, _ in pairs:
            _check_length(setting, text)
        return pairs
    types = _TYPES[setting.kind]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise StreamStudioError(f"setting {setting.name} has the wrong type ({type(value).__name__}); "
                                f"it takes {setting.kind_words()}")
    if setting.max_chars is not None and isinstance(value, str):  # (text settings)
        _check_length(setting, value)
    return setting.check(value)


def _check_length(setting: LiveSetting, text: str) -> None:
    if setting.max_chars is not None and len(text) > setting.max_chars:
        raise StreamStudioError(f"a prompt may have at most {setting.max_chars} characters (the text encoder "
                                f"reads 77 tokens), got {len(text)}")


def _parse_blend(items) -> list[tuple[str, float]]:
    pairs = []
    for item in items:
        if not (isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], (int, float)) and not isinstance(item[1], bool)):
            raise StreamStudioError('a prompt blend is a list of [prompt, weight] pairs, '
                                    'e.g. [["a cat", 0.7], ["a dog", 0.3]]')
        pairs.append((item[0], float(item[1])))
    if not 1 <= len(pairs) <= MAX_PROMPTS or any(w < 0 for _, w in pairs) or sum(w for _, w in pairs) <= 0:
        raise StreamStudioError(f"a prompt blend takes 1 to {MAX_PROMPTS} prompts with non-negative weights, "
                                "at least one above zero")
    return pairs


# ---------------------------------------------------------------------------- the Live tab
def live_keys() -> tuple[str, ...]:
    """The Live tab's settings, in the order its controls hand their values to a handler."""
    return tuple(s.name for s in live_settings.tab_settings())


def control_scale_key(index: int) -> str:
    """The Live tab's key of ControlNet `index`'s scale slider ("control_scales.0"); the sliders'
    values are handed on as one `control_scales` list."""
    return f"{CONTROL_SCALES}.{index}"


def settings_from_ui(keys, values) -> dict:
    """Settings from the UI controls' values (Gradio gives numbers as floats, may give None); the
    ControlNet sliders' (`control_scale_key`) become one control_scales list, in net order; the
    IP-Adapter slider's is `ip_adapter_scale`."""
    table = live_settings.SETTINGS
    out: dict[str, Any] = {}
    scales: dict[int, float] = {}
    for key, value in zip(keys, values):
        if value is None:
            continue
        name, dot, index = key.partition(".")
        if dot and name == CONTROL_SCALES:
            scales[int(index)] = float(value)
            continue
        if key == IP_ADAPTER_SCALE:
            out[key] = float(value)
            continue
        kind = table[key].kind
        out[key] = int(value) if kind is int else bool(value) if kind is bool else value
    if scales:
        out[CONTROL_SCALES] = [scales[i] for i in sorted(scales)]
    return out


def widget(setting: LiveSetting, value, **change):
    """The Gradio component of one setting (`change`: its arguments to override, e.g. a label)."""
    import gradio as gr

    s = setting
    kw = dict(label=s.label or s.name, value=value, elem_id=s.elem_id)
    if s.widget == "text":
        return gr.Textbox(**kw | dict(max_length=s.max_chars, lines=s.lines) | change)
    if s.widget == "slider":
        assert s.low is not None and s.high is not None and s.step is not None  # (LiveSetting checks a slider's)
        low = s.low + s.step if s.low_open else s.low
        high = round(s.step * int(s.high / s.step + 1e-9), 9)  # the last step inside the range
        if s.slider_low is not None:  # the slider's narrower range, widened to show `value`
            low = min(s.slider_low, value)
        if s.slider_high is not None:
            high = max(s.slider_high, value)
        return gr.Slider(low, high, **kw | dict(step=s.step) | change)
    if s.widget == "number":
        return gr.Number(**kw | dict(precision=0 if s.kind is int else None, minimum=s.low, maximum=s.high) | change)
    if s.widget == "checkbox":
        return gr.Checkbox(**kw | change)
    if s.widget in ("dropdown", "radio"):
        choices = list(zip(s.choice_labels, s.choices)) if s.choice_labels else list(s.choices)
        return (gr.Dropdown if s.widget == "dropdown" else gr.Radio)(choices, **kw | change)
    raise ValueError(f"setting {s.name} has no widget")


def video_controls(names=None, values: dict | None = None) -> dict:
    """The Video tab's controls of the video table {name: component}, in order (all that have a
    widget, or those of `names`), showing `values` (the table's default for a setting not there).
    Call inside a Gradio Blocks."""
    chosen = [s for s in live_settings.VIDEO_SETTINGS.values() if s.widget is not None
              and (names is None or s.name in names)]
    return {s.name: widget(s, (values or {}).get(s.name, s.default)) for s in chosen}


def video_values(names, values) -> dict:
    """The Video tab's control values {name: value} checked against the video table (a value the
    page could not send, say, is the setting's one-line error)."""
    table = live_settings.VIDEO_SETTINGS
    return {name: table[name].check(value) for name, value in zip(names, values)}


def live_controls(config, prompt: str = "", negative_prompt: str = "") -> dict:
    """The Live tab's controls {name: component}, in order, showing `config`'s values (the
    table's default for a setting the config lacks). Call inside a Gradio Blocks."""
    now = {"prompt": prompt, "negative_prompt": negative_prompt}
    size = {"width": config.width, "height": config.height}
    return {s.name: widget(s, now.get(s.name, getattr(config, s.name, s.default)), label=s.label.format(**size))
            for s in live_settings.tab_settings()}


# ---------------------------------------------------------------------------- the command line
def add_setting_flags(parser, names=None, table: dict[str, LiveSetting] | None = None) -> None:
    """A table's command-line options (the image table's by default; all that have one, or those
    of `names`) on `parser` (a parser or an argument group), checked while the command line is parsed."""
    table = live_settings.SETTINGS if table is None else table
    chosen = [table[n] for n in names] if names else list(table.values())
    for s in chosen:
        if s.flag is None:
            continue
        default = None if s.cli_optional else s.default
        notes = [] if s.cli_optional or s.default in ("", None) else [f"default {s.default}"]
        notes += [f"range {s.range_words()}"] if s.low is not None and s.high is not None and s.high < 2**31 else []
        text = f"{s.help} ({'; '.join(notes)})" if notes else s.help
        if s.kind is bool:
            parser.add_argument(s.flag, action=argparse.BooleanOptionalAction, default=default, help=text)
        else:
            parser.add_argument(s.flag, type=SettingType(s), choices=s.choices or None, default=default, help=text)


class SettingType:
    """The argparse type of a table setting's flag: the text converted to the setting's kind and
    checked against its range (nan and inf included) while the command line is parsed, so a bad
    value is the command's usage error at once, before anything loads. `kind` is what a config
    file's value is converted to (app/cli/render.py)."""

    def __init__(self, setting: LiveSetting):
        self.setting, self.kind = setting, setting.kind
        self.__name__ = setting.kind.__name__  # argparse names the type in its own messages

    def __call__(self, text):
        s = self.setting
        try:
            value = s.kind(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"{s.name} must be {s.kind_words()}, got {text!r}") from None
        return self.check(value)

    def check(self, value):
        """`value` (already of the setting's kind) checked; argparse's error when it is wrong."""
        try:
            return self.setting.check(value)
        except StreamStudioError as exc:
            raise argparse.ArgumentTypeError(str(exc).replace(f" (option {self.setting.flag})", "")) from None


def host_port(text: str) -> tuple[str, int]:
    """An argparse type for HOST:PORT (a UDP or TCP target): a host and a port 1-65535."""
    host, sep, port = str(text).rpartition(":")
    if not sep or not host.strip("[]"):
        raise argparse.ArgumentTypeError(f"HOST:PORT expected, got {text!r}")
    return host.strip("[]"), number(int, 1, 65535)(port)


def number(kind: type = float, low: float | None = None, high: float | None = None, low_open: bool = False,
           multiple: int = 1):
    """An argparse type for a number flag that no settings-table entry declares (sizes, counts,
    rates, ports): finite, within [low, high] (`low_open`: low itself refused), a multiple of
    `multiple`; checked while the command line is parsed."""

    def convert(text):
        try:
            value = kind(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"{'a whole number' if kind is int else 'a number'} expected, "
                                             f"got {text!r}") from None
        bad = not math.isfinite(value) or (low is not None and (value <= low if low_open else value < low)) \
            or (high is not None and value > high)
        if bad:
            lo = "-inf" if low is None else f"{kind(low)}" if kind is int else f"{low:g}"
            hi = "inf" if high is None else f"{kind(high)}" if kind is int else f"{high:g}"
            raise argparse.ArgumentTypeError(f"must be in {'(' if low_open else '['}{lo}, {hi}], got {text}")
        if multiple > 1 and value % multiple:
            raise argparse.ArgumentTypeError(f"must be a multiple of {multiple}, got {text}")
        return value

    convert.__name__ = kind.__name__
    convert.kind = kind  # type: ignore[attr-defined]  # (render.py's config reader asks a checking type its kind)
    return convert


def _dest(flag: str) -> str:
    """The argparse destination of a setting's flag (--filter-threshold: filter_threshold)."""
    return flag.lstrip("-").replace("-", "_")


def pipeline_dests(table: dict[str, LiveSetting] | None = None) -> dict[str, str]:
    """{argparse destination: setting name} of every setting of `table` (the image table by
    default) of the pipeline's config that has a flag (filter_threshold: similarity_threshold)."""
    table = live_settings.SETTINGS if table is None else table
    return {_dest(s.flag): s.name for s in table.values() if s.pipeline and s.flag is not None}


def config_values(given: dict, table: dict[str, LiveSetting] | None = None) -> dict:
    """The pipeline settings among `given` ({flag destination: value}, as a command line gives
    them), by their table name ({"strength": 0.5, "guidance_scale": 1.4, ...}), so a setting added
    to the table reaches the config with no other line. A `cli_optional` flag not given (None) is
    left out: the command picks its value (guidance by the model's kind; the similarity threshold
    turns the filter on only when given)."""
    table = live_settings.SETTINGS if table is None else table
    return {name: given[dest] for dest, name in pipeline_dests(table).items()
            if dest in given and not (given[dest] is None and table[name].cli_optional)}


def flag_dests() -> dict[str, str]:
    """{setting name: the argparse destination of its flag} where the two differ
    (guidance_scale: guidance), so a config file may use either name."""
    table = live_settings.SETTINGS.values()
    dests = {s.name: _dest(s.flag) for s in table if s.flag is not None}
    return {name: dest for name, dest in dests.items() if name != dest}


# ---------------------------------------------------------------------------- the image pipeline's flags
MAX_SIDE = 4096  # --width / --height at most (a 4096x4096 SD latent is already 512x512)


LCM_LORA_HELP = ("the LCM-LoRA fused into an SD 1.5 or SDXL model that is not turbo or LCM already, for few-step "
                 "sampling: auto (latent-consistency/lcm-lora-sdv1-5 or lcm-lora-sdxl, from the hub or its cache), a "
                 "hub id, a local .safetensors file or folder, or none (the model as it is: few steps then give poor "
                 "images) (default auto)")


MAX_STEPS = 50  # the LCM schedule's length: --steps and --t-index live inside it


def add_pipeline_arguments(parser: argparse.ArgumentParser) -> None:
    """The image pipeline's settings, shared by generate, render and serve."""
    g = parser.add_argument_group("image pipeline")
    g.add_argument("--model", default="auto",
                   help="builtin, tiny, a hub id, a diffusers folder or a .safetensors file; auto = "
                        "stabilityai/sd-turbo with a CUDA GPU (downloaded once), else the built-in image model "
                        "(default: auto)")
    # the live settings: --prompt, --strength, --guidance, --seed, --temporal, ... (--fit is the input's:
    # render and generate add it with their inputs)
    add_setting_flags(g, names=[n for n in live_settings.SETTINGS if n != "fit"])
    g.add_argument("--steps", type=number(int, 1, MAX_STEPS), default=None,
                   help="denoising steps N (default 1 for turbo models, 2 otherwise)")
    g.add_argument("--t-index", type=number(int, 0, MAX_STEPS - 1), nargs="+", default=None, metavar="I",
                   help="explicit indices into the 50-step LCM schedule (overrides --steps/--strength)")
    g.add_argument("--width", type=number(int, 8, MAX_SIDE, multiple=8), default=None,
                   help="output width, a multiple of 8 (default: the model's own side, 256 for builtin, 512 for SD "
                        "models, 64 for tiny; with an input, its aspect ratio with that long side, e.g. 256x144 for "
                        "a 16:9 clip; with only --height, from the aspect)")
    g.add_argument("--height", type=number(int, 8, MAX_SIDE, multiple=8), default=None,
                   help="output height, a multiple of 8 (default: as --width; with an input, from its aspect)")
    g.add_argument("--sequential", action="store_true", help="denoise step by step instead of Stream Batch")
    g.add_argument("--taesd", action="store_true", help="use the TAESD fast VAE (madebyollin/taesd)")
    g.add_argument("--lcm-lora", default="auto", metavar="ID|PATH|none", help=LCM_LORA_HELP)
    g.add_argument("--lora", action="append", default=[], metavar="PATH_OR_ID[:scale]",
                   help="a LoRA (.safetensors file, folder or hub id; SD 1.5/2.1 or SDXL), fused; repeatable")
    g.add_argument("--controlnet", action="append", default=[], metavar="ID_OR_PATH[:scale]",
                   help="a ControlNet (hub id or diffusers folder, e.g. lllyasviel/control_v11p_sd15_canny) with its "
                        "conditioning scale; repeatable; img2img only (the control image comes from each input frame)")
    g.add_argument("--control-preprocessor", action="append", default=[], metavar="NAME",
                   help="the preprocessor of each --controlnet, in the same order: canny (default), depth, lineart, "
                        "softedge or none (the frame itself)")
    g.add_argument("--control-image", default=None, metavar="FILE",
                   help="txt2img with --controlnet: the picture every image is controlled by (preprocessed once)")
    g.add_argument("--ip-adapter", default=None, metavar="ID_OR_PATH[:scale]",
                   help="an IP-Adapter (h94/IP-Adapter, or a .safetensors file with image_encoder/ beside it); "
                        "needs --ip-image")
    g.add_argument("--ip-image", default=None, metavar="FILE", help="the IP-Adapter's reference image")
    g.add_argument("--acceleration", choices=("none", "compile", "tensorrt"), default="none",
                   help="torch.compile or TensorRT engines for the UNet and VAE (default none)")
    g.add_argument("--frame-graph", action="store_true",
                   help="live runs on a GPU: each frame (preprocess, VAE, UNet, step, postprocess) replayed as one "
                        "captured CUDA graph with 2 frames in flight (outputs one frame behind; with --acceleration "
                        "compile the networks are compiled without graphs of their own); not for serve")
    g.add_argument("--fp8", action="store_true",
                   help="the UNet's linear and 1x1 layers as float8 e4m3 products (weights per channel, activations "
                        "per token): a GPU of compute capability 8.9+ (Ada, Hopper); not with --lora or TensorRT")
    g.add_argument("--device", default="auto", help="auto, cpu or cuda (default auto)")
    g.add_argument("--dtype", default="auto", help="auto (float16 on CUDA, float32 on CPU), float16, float32")
    g.add_argument("--threads", type=number(int, 1, 1024), default=None,
                   help="torch CPU threads (default on the CPU: one fewer than the usable CPUs, at most 8)")
