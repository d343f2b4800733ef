"""`streamstudio render`: run a video, a folder of images, a webcam or a test pattern through a
pipeline into a file, a folder of images, an RTMP server or an HLS folder.

Files and folders are rendered frame-aligned (output frame i is input frame i, with its
timestamp, and the source's audio kept); webcams, screens, patterns, network streams and NDI
sources (ndi://NAME) run live (the latest frame is processed, late frames are dropped and
counted). --fps on a video file resamples it by timestamps (frames dropped or repeated), so
its duration and audio stay as they were."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import yaml

from streamstudio.app.batch.cluster import add_arguments as add_batch_arguments
from streamstudio.app.batch.cluster import wants_batch
from streamstudio.app.cli.requests import batch_request
from streamstudio.app.settings import add_pipeline_arguments, add_setting_flags, flag_dests, number
from streamstudio.app.streams.video import DEFAULT_FRAMES
from streamstudio.errors import StreamStudioError
from streamstudio.models.hub import check_model_source
from streamstudio.pipelines import live_settings  # (its tables read when used: tests add a setting)
from streamstudio.streaming.sinks import check_not_input, sink_kind
from streamstudio.streaming.sources import source_kind


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("render", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    io = p.add_argument_group("input and output")
    io.add_argument("--input", default=None,
                    help="a video file, a folder or glob of images, webcam:N, pattern[:WxH][@FPS], screen[:N], a "
                         "network stream (rtmp://, srt://, ...) or ndi://NAME (an NDI source, found by name: "
                         "its size is read at once, its frames are taken once the model is ready)")
    io.add_argument("--output", default=None,
                    help="out.mp4|.mkv|.webm|.mov, a folder (PNG frames), frames/%%05d.png, rtmp://host/app/key, "
                         "hls:DIR, virtualcam, ndi://NAME (an NDI source others receive, each frame's time as "
                         "its timecode, the rate it is sent at advertised) or null")
    io.add_argument("--config", default=None, help="a YAML file with any of these settings (dashes or underscores)")
    io.add_argument("--prompt-schedule", default=None,
                    help="a file of prompts (and ControlNet / IP-Adapter scales) at timestamps, blended over "
                         "--transition seconds (see docs/streaming.md)")
    io.add_argument("--transition", type=number(float, 0, 3600), default=None,
                    help="prompt-schedule blend seconds (default 1)")
    io.add_argument("--modulation", default=None, metavar="FILE",
                    help="settings driven by LFOs and the beat at each frame's time, a JSON file of mappings "
                         "(docs/performance.md); one file in, not with a batch")
    io.add_argument("--bpm", type=number(float, 20, 400), default=120.0,
                    help="with --modulation: the tempo its beat sources follow, from the file's start (default 120)")
    io.add_argument("--fps", type=number(float, 0, 1000, low_open=True), default=None,
                    help="output frame rate (default: the input's). A video file at another rate is resampled "
                         "by timestamps (frames dropped or repeated; duration and audio kept); image folders and "
                         "patterns take it as their own rate; live inputs (webcam, streams) are not resampled")
    io.add_argument("--max-frames", type=number(int, 1, 10**9), default=None,
                    help="stop after N input frames (after resampling to --fps)")
    io.add_argument("--mode", choices=("auto", "live", "offline"), default="auto",
                    help="auto: live for webcam/screen/pattern/streams, offline (every frame) for files and "
                         "folders; live on a file plays it at its own pace, dropping what processing cannot keep "
                         "up with")
    io.add_argument("--no-audio", action="store_true", help="do not copy the input's audio")
    io.add_argument("--rtmp-timeout", type=number(float, 0, 3600, low_open=True), default=None, metavar="SECONDS",
                    help="RTMP output: seconds to reach the server, and that one write may wait on it, before "
                         "the connection is given up and retried (default 5)")
    add_setting_flags(io, names=["fit"])  # the settings table's --fit (pipelines/live_settings.py)
    io.add_argument("--pipeline", choices=("image", "video"), default="image",
                    help="image: stream-batched diffusion per frame; video: the streaming video model")
    add_batch_arguments(io)
    add_pipeline_arguments(p)
    add_video_arguments(p)
    p.set_defaults(_render_defaults={a.dest: a.default for a in p._actions if a.dest != "help"},
                   _render_actions={a.dest: a for a in p._actions if a.dest != "help"})
    return p


def add_video_arguments(parser: argparse.ArgumentParser) -> None:
    """The video pipeline's own options (render_video.py runs it)."""
    g = parser.add_argument_group("video pipeline (--pipeline video)")
    g.add_argument("--frames", type=number(int, 1, 10**7), default=None,
                   help=f"text-to-video: frames to make (default {DEFAULT_FRAMES})")
    add_setting_flags(g, table=live_settings.VIDEO_SETTINGS)  # --video-strength, --video-guidance, --num-chunks, ...
    g.add_argument("--prompt-change", action="append", default=None, metavar="FRAME:PROMPT",
                   help="switch to PROMPT from output frame FRAME on (repeatable)")
    g.add_argument("--wan-base", default=None, metavar="FOLDER_OR_HUB_ID",
                   help="a causal generator's Wan 2.1 base (text encoder and VAE): a diffusers folder or hub id "
                        "(default Wan-AI/Wan2.1-T2V-1.3B-Diffusers); with --model a Self-Forcing, CausVid or "
                        "StreamDiffusionV2 .pt file or hub id")
    g.add_argument("--video-decoder", choices=("wan", "taehv"), default="wan",
                   help="a causal Wan generator's codec: wan, the Wan 2.1 VAE of --wan-base (default); taehv, "
                        "madebyollin's tiny autoencoder (about 30x less compute, a little less quality; --taehv)")
    g.add_argument("--taehv", default=None, metavar="FILE",
                   help="--video-decoder taehv's weights: a taew2_1.pth or taew2_1.safetensors file from "
                        "github.com/madebyollin/taehv (not on the Hugging Face hub)")


# ---------------------------------------------------------------------------- settings
def apply_config(args, path: str | Path) -> None:
    """Settings from a YAML file, by option name (dashes or underscores) or, for the live
    settings, by their name in the table and the web API (guidance_scale for --guidance); options
    given on the command line win."""
    path = Path(path)
    if not path.is_file():
        raise StreamStudioError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise StreamStudioError(f"config file {path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise StreamStudioError(f"config file {path} must be a mapping of setting: value")
    defaults = getattr(args, "_render_defaults", {})
    known = {k for k in defaults if not k.startswith("_") and k != "config"}
    aliases = flag_dests()
    data = {aliases.get(k, k): v for k, v in data.items()}
    unknown = sorted(k for k in data if str(k).replace("-", "_") not in known)
    if unknown:
        raise StreamStudioError(f"unknown setting(s) in {path}: {', '.join(map(str, unknown))}; "
                                f"known: {', '.join(sorted(known))}")
    actions = getattr(args, "_render_actions", {})
    for key, value in data.items():
        dest = str(key).replace("-", "_")
        if getattr(args, dest, None) == defaults.get(dest):
            action = actions.get(dest)
            setattr(args, dest, value if action is None else config_value(action, key, value, path))


def config_value(action: argparse.Action, key, value, path):
    """A config file's `value` for an option, as the command line would have given it: checked
    against the option's type and choices (strings converted as argparse would, "0.5" -> 0.5);
    a value of the wrong kind is a StreamStudioError naming the key and the type expected."""
    if value is None:  # `key:` with nothing after it: the option's default
        return action.default
    if action.nargs == 0:  # store_true / store_false flags
        if not isinstance(value, bool):
            raise StreamStudioError(f"config file {path}: {key} must be true or false, got {value!r}")
        return value
    if action.nargs in ("+", "*") or isinstance(action.nargs, int):
        items = value if isinstance(value, list) else [value]
        if not items and action.nargs == "+":
            raise StreamStudioError(f"config file {path}: {key} needs at least one value")
        return [_config_scalar(action, key, item, path) for item in items]
    if isinstance(value, (list, dict)):
        raise StreamStudioError(f"config file {path}: {key} must be {_kind(action)}, got {value!r}")
    return _config_scalar(action, key, value, path)


def _kind(action: argparse.Action) -> str:
    if action.choices:
        return "one of " + ", ".join(map(str, action.choices))
    kind: Any = getattr(action.type, "kind", action.type)  # a type; a checking type (app/settings.py): its kind
    return {int: "a whole number", float: "a number"}.get(kind, "a string")


def _config_scalar(action: argparse.Action, key, value, path):
    kind = _kind(action)
    if isinstance(value, (list, dict)) or isinstance(value, bool) or value is None:
        raise StreamStudioError(f"config file {path}: {key} must be {kind}, got {value!r}")
    convert: Any = getattr(action.type, "kind", action.type)  # a checking type (app/settings.py) says its kind
    if convert is int and isinstance(value, float):  # 64.0 is fine, 64.5 is not
        if not value.is_integer():
            raise StreamStudioError(f"config file {path}: {key} must be {kind}, got {value!r}")
        value = int(value)
    elif convert is None or isinstance(value, str) or not isinstance(value, convert):
        try:
            value = (convert or str)(value if isinstance(value, str) else str(value))
        except (TypeError, ValueError):
            raise StreamStudioError(f"config file {path}: {key} must be {kind}, got {value!r}") from None
    if convert is float and not math.isfinite(value):
        raise StreamStudioError(f"config file {path}: {key} must be a finite number, got {value!r}")
    if action.choices and value not in action.choices:
        raise StreamStudioError(f"config file {path}: {key} must be {kind}, got {value!r}")
    if convert is not action.type:  # the range the option's checking type holds it to
        check = action.type
        assert callable(check)  # (a checking type: a function)
        try:
            value = check(value)
        except argparse.ArgumentTypeError as exc:
            raise StreamStudioError(f"config file {path}: {key}: {exc}") from None
    return value


def _check_args(args) -> None:
    if not args.input and args.pipeline == "image":
        raise StreamStudioError("--input is required (a video, a folder of images, webcam:N or pattern)")
    if not args.output:
        raise StreamStudioError("--output is required (a video file, a folder, rtmp://... or hls:DIR)")
    if args.max_frames is not None and args.max_frames < 1:
        raise StreamStudioError("--max-frames must be at least 1")
    if args.pipeline == "image" and getattr(args, "frames", None) is not None:  # (it was ignored without a word)
        raise StreamStudioError("--frames is the video pipeline's (frames of text-to-video); the image pipeline "
                                "stops after --max-frames N")
    if args.fps is not None and args.fps <= 0:
        raise StreamStudioError("--fps must be positive")
    if getattr(args, "rtmp_timeout", None) is not None and args.rtmp_timeout <= 0:
        raise StreamStudioError("--rtmp-timeout must be positive")


def _check_io(args) -> None:
    """The input exists, the output is one render can write and is not the input: said before
    any model loads (a batch's inputs and output are the batch's to check)."""
    if args.input:
        source_kind(args.input)
    sink_kind(args.output)
    check_not_input(args.output, [args.input])


# ---------------------------------------------------------------------------- checks
def check(args) -> None:
    """What render says before the model loads: the config file's settings, the flags, and for one
    file the input, the output and the model (a batch's inputs and output are the batch's to check)."""
    if args.config:
        apply_config(args, args.config)
    _check_args(args)
    if wants_batch(batch_request(args)):  # many files, or one in segments (app/batch/cluster.py)
        if args.modulation:
            raise StreamStudioError("--modulation renders one file in one run; not with a folder, --segment-frames, "
                                    "--workers or --cluster")
        return
    _check_io(args)
    if args.pipeline == "video":
        if args.modulation:
            raise StreamStudioError("--modulation drives the image pipeline's settings; not with --pipeline video")
        return
    check_model_source(args.model)  # a hub id that cannot be had: said at once, before torch loads
