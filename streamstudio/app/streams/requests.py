"""What a front end asks for, typed: built once (app/cli from a command line, the Splats tab with
`image.request`, a preset) and passed down, so nothing below the command line reads an argparse
Namespace. A setting of the live table (strength, guidance, seed, ...) travels by its table name
in `ImageRequest.settings`; its default stays in the table (pipelines/live_settings.py)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from streamstudio.pipelines.live_settings import SETTINGS

if TYPE_CHECKING:  # (models.image.batching imports torch: the command line starts without it)
    from streamstudio.models.image.batching import BatchingConfig


@dataclass
class Addons:
    """LoRA, ControlNet and IP-Adapter: loaded into the networks before acceleration, the same way
    for a stream and for the engines built for it (image.add_addons), so cache keys agree."""

    loras: list[str] = field(default_factory=list)  # PATH_OR_ID[:scale], fused in this order
    controlnets: list[str] = field(default_factory=list)  # ID_OR_PATH[:scale]
    control_preprocessors: list[str] = field(default_factory=list)  # one per ControlNet (default canny)
    ip_adapter: str | None = None  # ID_OR_PATH[:scale]
    ip_image: str | None = None  # the IP-Adapter's reference picture (a file)
    control_image: str | None = None  # txt2img: the picture every image is controlled by


@dataclass
class ImageRequest:
    """An image stream: the model, how it loads and runs, its size and settings, its add-ons."""

    model: str = "auto"  # builtin, tiny, a hub id, a folder or a .safetensors file
    width: int | None = None  # None: the model's side, or from the input's aspect
    height: int | None = None
    steps: int | None = None  # None: 1 for turbo models, 2 otherwise
    t_index: list[int] | None = None
    sequential: bool = False  # step by step instead of Stream Batch
    taesd: bool = False
    lcm_lora: str = "auto"
    acceleration: str = "none"  # none, compile, tensorrt
    frame_graph: bool = False  # live frames replayed as one captured graph (pipelines/image/frame_graph.py)
    fp8: bool = False  # the UNet's linear and 1x1 layers as FP8 products (models/image/fp8.py)
    device: str = "auto"
    dtype: str = "auto"
    threads: int | None = None
    prompt: str = str(SETTINGS["prompt"].default)
    negative_prompt: str = str(SETTINGS["negative_prompt"].default)
    settings: dict = field(default_factory=dict)  # live-table settings given, by table name
    addons: Addons = field(default_factory=Addons)
    batching: BatchingConfig | None = None  # cross-stream batching of a server's streams (None: off)


@dataclass
class ServeRequest:
    """`serve`'s model and sessions: in this process, on --gpus replicas or on a Ray cluster."""

    image: ImageRequest
    max_streams: int  # live streams at most (per replica with --gpus)
    idle_timeout: float  # seconds without a frame before a stream is freed
    latency_probe: bool = False
    gpus: int = 1
    cluster: str | None = None
    node_replicas: int = 1
    min_replicas: int | None = None  # elastic replicas on the cluster (app/web/ray_cluster.py); None: fixed
    max_replicas: int | None = None
    replica_idle_release: float = 60.0  # elastic: an idle replica stops after this many seconds
    replica_transport: str = "auto"
    live_pipeline: str = "image"  # what the live streams (Live tab, WHIP, /webrtc/offer) play: image or video
    video_model: str | None = None  # the Video tab's extra model, and the live streams' with live_pipeline video

    def on(self, device: str) -> ServeRequest:
        """The same request with the model on `device` (a replica's)."""
        return replace(self, image=replace(self.image, device=device))


@dataclass
class VideoRequest:
    """A video stream (app/streams/video.py): the model, how it loads and runs, its size and settings,
    as `render --pipeline video` renders a file (render_video.py) and a batch's video worker each of
    its files (app/batch/video.py)."""

    model: str | None = None  # None, auto, builtin: the built-in StreamDiT; a checkpoint folder, Wan or causal model
    wan_base: str | None = None  # a released causal generator's Wan 2.1 base (text encoder and VAE)
    device: str = "auto"
    dtype: str = "auto"
    threads: int | None = None
    acceleration: str = "none"
    prompt: str = ""
    prompt_changes: dict[int, str] = field(default_factory=dict)  # output frame -> the prompt from there on
    seed: int = 0
    width: int | None = None  # None: the checkpoint's side, or from the input's aspect
    height: int | None = None
    settings: dict = field(default_factory=dict)  # the video table's settings given (strength, num_chunks, ...)
    guidance: float | None = None  # None: the checkpoint's
    fit: str = "crop"  # an input of another aspect: cropped or padded to the output's


@dataclass
class BatchRequest:
    """`render` of many files or of one in segments (app/batch): the image or video stream and the I/O."""

    image: ImageRequest
    video: VideoRequest = field(default_factory=VideoRequest)  # --pipeline video's stream
    input: str | None = None
    output: str | None = None
    fingerprint: dict = field(default_factory=dict)  # the command's settings as plain values (jobs.json)
    pipeline: str = "image"
    cluster: str | None = None
    workers: int | None = None
    segment_frames: int | None = None
    fps: float | None = None  # None: the input's
    max_frames: int | None = None
    prompt_schedule: str | None = None
    transition: float | None = None
    fit: str = "crop"
    no_audio: bool = False
    rtmp_timeout: float | None = None
