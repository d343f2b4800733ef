"""The image stream's live settings (`SETTINGS`), the video stream's (`VIDEO_SETTINGS`) and the
splat renderer's (`SPLAT_SETTINGS`), each declared once: name, type, range or choices, default,
help, the tab's widget and the CLI flag. At pipelines/' root because it serves every product: the
image and video pipelines (`image/stream_diffusion.py`, `video/stream_video.py`) check their
configs with it, and the app builds every product's controls and flags from it.

Pure data and checks (no Gradio, no argparse): `StreamDiffusionConfig` (its defaults and
`validate`), the web API (`app/settings.py`), the Live, Video and Splats tabs, the command-line
flags (`app/settings.py`) and the render config file (built from those flags) all read these
tables, so changing a range or adding a setting is one edit here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from streamstudio.errors import StreamStudioError
from streamstudio.frames import FIT_MODES

CFG_TYPES = ("none", "self", "initialize", "full")  # the names of kernels.reference.CFG_CODES (no torch here)
VIDEO_SOLVERS = ("euler", "ab2", "heun")  # a video frame's step to the next level (pipelines/video/stream_video)
TEMPORAL_MODES = ("off", "feedback", "bank", "both")  # temporal consistency: none, latent feedback, feature bank, both
MAX_PROMPT_CHARS = 1000  # the text encoder reads 77 tokens (~300 characters); more is refused from clients
MAX_PROMPTS = 3  # prompts in one blend
WIDGETS = ("text", "slider", "number", "dropdown", "checkbox", "radio")


@dataclass(frozen=True)
class LiveSetting:
    """One setting. `low`/`high` bound a number (`low_open`: the low end itself is refused),
    `choices` a string. `widget` None: not a Live tab control; `flag` None: no CLI option;
    `live` False: set at start only (config and CLI), not changeable through the web API;
    `cli_optional`: the flag defaults to None and the command picks the value (`help` says how);
    `pipeline` False: a session's setting, not a `StreamDiffusionConfig` field."""

    name: str
    kind: type  # str, int, float or bool
    default: object
    help: str
    flag: str | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    choices: tuple[str, ...] = ()
    choice_labels: tuple[str, ...] = ()  # the UI's words for `choices`, in their order
    widget: str | None = None
    label: str = ""  # the UI's label; `{width}`, `{height}` name the stream's size
    step: float | None = None  # a slider's step
    slider_low: float | None = None  # a slider's range when narrower than what is taken (widened to show
    slider_high: float | None = None  # a value outside it): the add-on scales' 0..2 of [-10, 10]
    max_chars: int | None = None  # text settings
    lines: int = 1  # a text box's height
    elem_id: str | None = None  # the UI element's id, for pages and tests that find it
    live: bool = True
    cli_optional: bool = False
    pipeline: bool = True

    def __post_init__(self):  # a slip in the table fails at import, not in a user's session
        if self.kind not in (str, int, float, bool) or (self.widget is not None and self.widget not in WIDGETS):
            raise TypeError(f"setting {self.name}: kind must be str, int, float or bool and widget one of {WIDGETS}")
        if self.widget == "slider" and None in (self.low, self.high, self.step):
            raise TypeError(f"setting {self.name}: a slider needs low, high and step")
        if self.choice_labels and len(self.choice_labels) != len(self.choices):
            raise TypeError(f"setting {self.name}: one label per choice")

    def check(self, value):
        """`value` checked against the type, range and choices; whole numbers come back as int,
        other numbers as float. A bad value is a StreamStudioError of one line naming the setting."""
        where = f" (option {self.flag})" if self.flag else ""
        if self.kind in (int, float):
            return self._number(value, where)
        if not isinstance(value, self.kind) or (isinstance(value, bool) and self.kind is not bool):
            raise StreamStudioError(f"{self.name} must be {self.kind_words()}, got {value!r}{where}")
        if self.choices and value not in self.choices:
            raise StreamStudioError(f"{self.name} must be one of {', '.join(self.choices)}, got {value!r}{where}")
        if self.max_chars is not None and isinstance(value, str) and len(value) > self.max_chars:
            raise StreamStudioError(f"{self.name} may have at most {self.max_chars} characters, got {len(value)}")
        return value

    def _number(self, value: object, where: str) -> int | float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise StreamStudioError(f"{self.name} must be {self.kind_words()}, got {value!r}{where}")
        if math.isnan(value) or (self.low is not None and (value <= self.low if self.low_open else value < self.low)) \
                or (self.high is not None and value > self.high):
            raise StreamStudioError(f"{self.name} must be in {self.range_words()}, got {_num(value)}{where}")
        if self.kind is int:
            if isinstance(value, float) and not value.is_integer():
                raise StreamStudioError(f"{self.name} must be a whole number, got {value:g}{where}")
            return int(value)
        return float(value)

    def range_words(self) -> str:
        """The range as intervals are written: "(0, 1]", "[0, 30]"."""
        return f"{'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}]"

    def kind_words(self) -> str:
        return {int: "a whole number", float: "a number", bool: "true or false", str: "text"}[self.kind]


def _num(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _table(*settings: LiveSetting) -> dict[str, LiveSetting]:
    return {s.name: s for s in settings}


# In the Live tab's order (the widgets), then the settings the tab does not show.
SETTINGS: dict[str, LiveSetting] = _table(
    LiveSetting("prompt", str, "", "the prompt", flag="--prompt", widget="text", label="Prompt",
                max_chars=MAX_PROMPT_CHARS, lines=2, elem_id="live-prompt", pipeline=False),
    LiveSetting("negative_prompt", str, "", "the negative prompt (used by full and initialize CFG)",
                flag="--negative-prompt", widget="text", label="Negative prompt", max_chars=MAX_PROMPT_CHARS,
                pipeline=False),
    LiveSetting("strength", float, 0.5, "img2img strength: how far from the input (1 = pure noise start)",
                flag="--strength", low=0.0, high=1.0, low_open=True, widget="slider", step=0.05,
                label="Strength (how far from the camera image)"),
    LiveSetting("guidance_scale", float, 1.2, "guidance scale (default 1.0 for turbo models, 1.2 otherwise)",
                flag="--guidance", low=0.0, high=30.0, widget="slider", step=0.1, label="Guidance", cli_optional=True),
    LiveSetting("delta", float, 1.0, "residual CFG delta", flag="--delta", low=0.0, high=5.0, widget="slider",
                step=0.05, label="Residual CFG delta"),
    LiveSetting("cfg_type", str, "self", "CFG type", flag="--cfg", choices=CFG_TYPES, widget="dropdown",
                label="CFG type"),
    LiveSetting("seed", int, 0, "noise seed", flag="--seed", low=0, high=2**63 - 1, widget="number", label="Seed"),
    LiveSetting("similarity_filter", bool, False, "skip frames that barely change (stochastic similarity filter)",
                widget="checkbox", label="Skip frames that barely change (similarity filter)"),
    LiveSetting("similarity_threshold", float, 0.98,
                "turn the stochastic similarity filter on with this threshold (e.g. 0.98)", flag="--filter-threshold",
                low=0.0, high=0.9999, widget="slider", step=0.001, label="Similarity threshold", cli_optional=True),
    LiveSetting("temporal", str, "off", "temporal consistency for video: latent feedback, the StreamV2V feature "
                "bank, both, or off", flag="--temporal", choices=TEMPORAL_MODES, widget="dropdown",
                label="Temporal consistency (less flicker: latent feedback, StreamV2V feature bank, or both)"),
    LiveSetting("fit", str, "crop", "an input of another aspect ratio than the output: crop it (centred) or pad it "
                "with black bars (the whole picture kept); never stretched. Without --width/--height the output "
                "takes the input's aspect ratio", flag="--fit", choices=FIT_MODES,
                choice_labels=("Crop to fill", "Pad: the whole picture, with bars"),
                widget="radio", elem_id="live-fit", pipeline=False,
                label="A camera picture of another shape than the stream's (which takes the camera's "
                      "first picture's): crop its edges, or pad it with bars"),
    LiveSetting("feedback_weight", float, 0.3, "latent feedback: the last output's share of the next input latent",
                flag="--feedback-weight", low=0.0, high=0.99),
    LiveSetting("bank_size", int, 2, "feature bank: past frames kept per layer and step", flag="--bank-size",
                low=0, high=16),
    LiveSetting("bank_interval", int, 1, "feature bank: store every n-th frame's features", flag="--bank-interval",
                low=1, high=10_000),
    LiveSetting("bank_threshold", float, 0.98, "feature bank: cosine similarity from which features are fused",
                flag="--bank-threshold", low=0.0, high=1.0),
    LiveSetting("bank_fusion", float, 0.8, "feature bank: fusion strength, 0 = extended attention only",
                flag="--bank-fusion", low=0.0, high=1.0),
    LiveSetting("max_skip_frame", int, 10, "frames skipped in a row at most", flag="--max-skip-frame",
                low=1, high=10_000, live=False),
)


# The video pipeline's settings (`render --pipeline video`, the Video tab, `StreamBufferConfig`);
# a name is `app/streams/video.build_stream`'s argument. The prompt and the seed are the image
# table's (one --prompt, one --seed for both pipelines).
VIDEO_SETTINGS: dict[str, LiveSetting] = _table(
    LiveSetting("strength", float, 0.6, "video-to-video: how much of each input frame is re-generated "
                "(text-to-video starts from pure noise: 1)", flag="--video-strength", low=0.0, high=1.0,
                low_open=True, widget="slider", step=0.05, label="Strength", elem_id="video-strength"),
    LiveSetting("guidance", float, 1.0, "classifier-free guidance of the video model against the empty prompt "
                "(default: the checkpoint's; 1 = none, one network call per step, 2x the calls otherwise)",
                flag="--video-guidance", low=0.0, high=30.0, cli_optional=True, pipeline=False),
    LiveSetting("num_chunks", int, 4, "buffer chunks N (default: the checkpoint's)", flag="--num-chunks",
                low=1, high=64, cli_optional=True, live=False),
    LiveSetting("chunk_size", int, 2, "frames per chunk c (default: the checkpoint's)", flag="--chunk-size",
                low=1, high=64, cli_optional=True, live=False),
    LiveSetting("micro_steps", int, 2, "micro-steps per chunk s (default: the checkpoint's)", flag="--micro-steps",
                low=1, high=64, cli_optional=True, live=False),
    LiveSetting("solver", str, "euler", "how a frame moves one noise level: euler (the paper's), ab2 (second "
                "order from the frame's last velocity, no more network calls) or heun (second order, 2x the "
                "calls) (default: the checkpoint's)", flag="--video-solver", choices=VIDEO_SOLVERS,
                choice_labels=("Euler (fastest)", "AB2 (second order, no extra calls)",
                               "Heun (steadiest, half the frame rate)"),
                cli_optional=True, live=False, widget="radio", label="Step", elem_id="video-solver"),
)


# An add-on's scale: a LoRA's (server-wide), a ControlNet's conditioning scale and the IP-Adapter's
# (each stream's own). The web API, the CLI's `ID_OR_PATH[:scale]` and the model
# (models/image/lora.check_scale) take [-10, 10]; the sliders show 0..2, widened to take in a start
# value outside it.
ADDON_SCALE = LiveSetting("scale", float, 1.0, "an add-on's scale (LoRA, ControlNet, IP-Adapter)", low=-10.0,
                          high=10.0, widget="slider", step=0.05, slider_low=0.0, slider_high=2.0)


# The splat renderer's names, here so that the splat command parses without torch (the kernels and
# the renderer import it); tests/cli/test_cli_startup.py keeps them equal to kernels.splat.IMPLS and
# pipelines.splats.splat_render.PATHS / MODES / CAMERAS.
SPLAT_PATHS = ("orbit", "turntable", "fly")
SPLAT_MODES = ("rgb", "depth", "alpha")
SPLAT_CAMERAS = ("perspective", "ortho", "fisheye")
SPLAT_IMPLS = ("auto", "reference", "cpp", "fast", "fast_compiled", "cuda")

# The splat renderer's settings: the Splats tab's view controls (in their order) and `streamstudio
# splat`'s camera and render flags. `pipeline` True: a `SplatRenderConfig` field of the same name,
# taken as it is (app/settings.config_values); the view's orbit, zoom and pan place the camera, the
# background is a colour the config holds as RGB, and the size is the tab's view (the command's
# --size, WxH, checked against the same range, defaults to the path file's or 512x512).
SPLAT_SETTINGS: dict[str, LiveSetting] = _table(
    LiveSetting("azimuth", float, 30.0, "orbit azimuth in degrees", low=-180.0, high=180.0, widget="slider",
                step=1, label="Orbit (azimuth °)", pipeline=False),
    LiveSetting("elevation", float, 20.0, "orbit elevation in degrees, as the Splats tab's", flag="--elevation",
                low=-89.0, high=89.0, widget="slider", step=1, label="Elevation °", pipeline=False),
    LiveSetting("zoom", float, 1.0, "zoom", low=0.2, high=5.0, widget="slider", step=0.05, label="Zoom",
                pipeline=False),
    LiveSetting("pan_x", float, 0.0, "pan right", low=-1.0, high=1.0, widget="slider", step=0.01,
                label="Pan right", pipeline=False),
    LiveSetting("pan_y", float, 0.0, "pan up", low=-1.0, high=1.0, widget="slider", step=0.01, label="Pan up",
                pipeline=False),
    LiveSetting("width", int, 384, "frame width in pixels", low=8, high=4096, widget="slider", step=16,
                slider_low=64, slider_high=1024, label="Width", pipeline=False),
    LiveSetting("height", int, 384, "frame height in pixels", low=8, high=4096, widget="slider", step=16,
                slider_low=64, slider_high=1024, label="Height", pipeline=False),
    LiveSetting("sh_degree", int, 3, "spherical-harmonics degree", flag="--sh-degree", low=0, high=3,
                widget="slider", step=1, label="SH degree"),
    LiveSetting("background", str, "#000000", "background #rrggbb, #rgb or R,G,B in 0..1", flag="--background",
                label="Background", pipeline=False),
    LiveSetting("mode", str, "rgb", "render mode", flag="--mode", choices=SPLAT_MODES,
                choice_labels=("RGB", "Depth", "Alpha"), widget="radio", label="Render mode"),
    LiveSetting("camera", str, "perspective", "camera model: ortho frames the scene centre as the perspective "
                "view would (or spans --ortho-height scene units); fisheye is equidistant, --fov across the "
                "height, up to 180", flag="--camera", choices=SPLAT_CAMERAS,
                choice_labels=("Perspective", "Ortho", "Fisheye"), widget="radio", label="Camera"),
    LiveSetting("fov_y_deg", float, 50.0, "vertical field of view in degrees, 50 unless given (a path file gives "
                "each camera's own)", flag="--fov", low=0.0, high=180.0, low_open=True, cli_optional=True),
    LiveSetting("ortho_height", float, None, "ortho: scene units across the image height", flag="--ortho-height",
                low=0.0, high=1e9, low_open=True, cli_optional=True),
    LiveSetting("impl", str, "auto", "rasteriser: auto is CUDA on a GPU, the fast CPU path otherwise; "
                "fast_compiled is the fast path through torch.compile, worth it for long renders",
                flag="--renderer", choices=SPLAT_IMPLS),
    LiveSetting("antialiased", bool, None, "gsplat's antialiased rasterize mode (Mip-Splatting's 2D filter), for "
                "scenes trained with it (default: as the scene's file says, e.g. 'SplatRenderMode: mip')",
                flag="--antialiased", cli_optional=True),
)


def defaults(table: dict[str, LiveSetting] | None = None) -> dict[str, Any]:
    """{name: default} of a table (the image table by default): what a config's fields default to."""
    return {s.name: s.default for s in (SETTINGS if table is None else table).values()}


def live_settings() -> list[LiveSetting]:
    """The settings the web API may change on a running stream."""
    return [s for s in SETTINGS.values() if s.live]


def tab_settings() -> list[LiveSetting]:
    """The Live tab's controls, in order."""
    return [s for s in SETTINGS.values() if s.widget is not None]


def check_config(config: object, table: dict[str, LiveSetting] | None = None) -> None:
    """Check every setting of `table` (the image table by default) a pipeline config has, and
    store whole numbers as int."""
    for s in (SETTINGS if table is None else table).values():
        if s.pipeline and hasattr(config, s.name):
            setattr(config, s.name, s.check(getattr(config, s.name)))
