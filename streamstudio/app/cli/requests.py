"""A command line turned into the typed request the rest of the app takes
(app/streams/requests.py): the one place below which no argparse Namespace is read. Which flags
a Namespace holds depends on its subcommand; a flag a command lacks is the request's default."""

from __future__ import annotations

from dataclasses import fields

from streamstudio.app.settings import config_values
from streamstudio.app.streams.requests import Addons, BatchRequest, ImageRequest, ServeRequest, VideoRequest
from streamstudio.app.streams.video import parse_prompt_changes
from streamstudio.pipelines import live_settings  # (its tables read when used: tests add a setting)

_NOT_FLAGS = {"settings", "addons", "batching", "image", "video", "fingerprint"}  # the requests' own fields


def _given(args, request_type) -> dict:
    """The flags of `args` named as `request_type`'s fields."""
    given = vars(args)
    return {f.name: given[f.name] for f in fields(request_type) if f.name in given and f.name not in _NOT_FLAGS}


def image_request(args) -> ImageRequest:
    """The image stream a command line asks for: model, size, table settings, add-ons, batching."""
    given = vars(args)
    addons = Addons(loras=list(given.get("lora") or []), controlnets=list(given.get("controlnet") or []),
                    control_preprocessors=list(given.get("control_preprocessor") or []),
                    ip_adapter=given.get("ip_adapter"), ip_image=given.get("ip_image"),
                    control_image=given.get("control_image"))
    serving = "no_stream_batching" in given  # serve and bench run streams behind the batching executor
    return ImageRequest(**_given(args, ImageRequest), settings=config_values(given), addons=addons,
                        batching=batching_config(args) if serving else None)


def video_request(args) -> VideoRequest:
    """The video stream a command line asks for (`render --pipeline video`): model, size, settings.
    A flag the command lacks, or left empty, is the request's default."""
    given = vars(args)
    return VideoRequest(model=given.get("model"), wan_base=given.get("wan_base"), device=given.get("device") or "auto",
                        dtype=given.get("dtype") or "auto", threads=given.get("threads"),
                        acceleration=given.get("acceleration") or "none", prompt=given.get("prompt") or "",
                        prompt_changes=parse_prompt_changes(given.get("prompt_change")), seed=given.get("seed") or 0,
                        width=given.get("width"), height=given.get("height"),
                        settings=config_values(given, live_settings.VIDEO_SETTINGS),
                        guidance=given.get("video_guidance"), fit=given.get("fit") or "crop")


def batching_config(args):
    """Cross-stream batching settings from the command line, or None when it is off."""
    from streamstudio.models.image.batching import BatchingConfig  # (torch: render.py imports this module to check)

    if getattr(args, "no_stream_batching", False):
        return None
    return BatchingConfig(max_rows=getattr(args, "max_batch_rows", 16),
                          max_wait_ms=getattr(args, "batch_wait_ms", 2.0)).validate()


def serve_request(args) -> ServeRequest:
    """`serve`'s model and sessions."""
    return ServeRequest(image=image_request(args), **_given(args, ServeRequest))


def batch_request(args) -> BatchRequest:
    """`render`'s batch of files (app/batch): the image or video stream, the I/O, and the settings as
    plain values (what a batch's job list is keyed by)."""
    fingerprint = {k: v for k, v in vars(args).items() if not k.startswith("_") and not callable(v)}
    video = video_request(args) if getattr(args, "pipeline", "image") == "video" else VideoRequest()
    return BatchRequest(image=image_request(args), video=video, fingerprint=fingerprint,
                        **_given(args, BatchRequest))
