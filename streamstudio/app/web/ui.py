"""The Gradio Blocks app: Live (webcam video-to-video over WebRTC), Text to image, Live output,
and the Video and Splats tabs when their modules are installed.

Every tab shares one loaded model (`SessionManager.model`); each browser stream is its own
session. Nothing here reads a server path a user names: recordings go to the server's
output folder under a cleaned file name.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import gradio as gr
import numpy as np

from streamstudio.app.web.decks import deck_preview
from streamstudio.app.web.mapping_ui import mapping_controls
from streamstudio.app.web.midi_ui import midi_controls
from streamstudio.app.web.outputs import LiveOutput, OutputRefused, Outputs
from streamstudio.app.web.model_guard import GuardedPipeline
from streamstudio.app.web.sessions import BusyError, SessionManager, StreamSession
from streamstudio.app.settings import (IP_ADAPTER_SCALE, control_scale_key, live_controls, live_keys, settings_from_ui,
                                       widget)
from streamstudio.app.web.webrtc import LiveHandler, explicit_rtc_config, live_component, may_control, operator
from streamstudio.errors import StreamStudioError
from streamstudio.models.image.loading import DEFAULT_MODEL, download_command
from streamstudio.pipelines.live_settings import ADDON_SCALE, SETTINGS

log = logging.getLogger(__name__)

T2I_TICK_S = 0.2  # text-to-image refresh interval
LIVE_KEYS = live_keys()  # the Live tab's controls, in order (pipelines/live_settings.py)
# What the Live tab asks of the camera: 480 lines, its own aspect ratio (fastrtc's default asks
# for 500x500, which Chrome crops every camera to; the stream's size follows the camera's aspect).
CAMERA_CONSTRAINTS = {"facingMode": "user", "height": {"ideal": 480}, "frameRate": {"ideal": 30}}

# Small outputs (a 64x64 demo model, a 256 px image) are drawn at the panel's size, not as stamps
# (the Live tab's video fills the panel's width; a portrait camera's stays within the window).
CSS = """
.scaled-up img { width: 100%; height: 100%; object-fit: contain; }
#live-webrtc video { max-height: 75vh; object-fit: contain; }
#live-camera-note:empty { display: none; }
#live-camera-note { padding: 10px 14px; border-radius: 8px; border: 1px solid var(--error-border-color, #ef4444);
  background: var(--error-background-fill, #fef2f2); color: var(--error-text-color, #b91c1c); }
.ss-hidden { display: none !important; }
"""

# fastrtc's webcam box calls getUserMedia and drops a failure unseen (an unhandled promise
# rejection: no event, no toast), so a page without a camera showed nothing. This wraps
# getUserMedia to say what went wrong under the box, and where to go instead.
CAMERA_JS = """() => {
  const md = navigator.mediaDevices;
  if (!md || !md.getUserMedia || md.__streamstudio) return;
  md.__streamstudio = true;
  const fallback = 'If a camera works here but no picture comes back, open "No picture? Use the plain webcam '
    + 'stream" below. Without a camera, the Text to image, Video and Splats tabs work, and '
    + '`streamstudio render --input clip.mp4` runs a video file through the model.';
  const say = (text) => { const el = document.getElementById('live-camera-note'); if (el) el.textContent = text; };
  const why = (err) => {
    const name = (err && err.name) || 'Error';
    if (name === 'NotFoundError' || name === 'OverconstrainedError')
      return 'No camera found: this browser has no webcam it can open. Connect one and click the box again. ';
    if (name === 'NotAllowedError' || name === 'SecurityError')
      return 'The camera is blocked: allow it for this page (the camera icon in the address bar; the page must be '
        + 'served over https or from localhost) and click the box again. ';
    if (name === 'NotReadableError' || name === 'AbortError')
      return 'The camera is busy or failed to start (another program may be using it): close that program and '
        + 'click the box again. ';
    return 'The camera could not be opened (' + name + (err && err.message ? ': ' + err.message : '') + '). ';
  };
  const original = md.getUserMedia.bind(md);
  md.getUserMedia = (constraints) => original(constraints).then(
    (stream) => { if (constraints && constraints.video) say(''); return stream; },
    (err) => { if (constraints && constraints.video) say(why(err) + fallback); throw err; });
}"""
HOW_TO_GET_A_MODEL = (
    f"For real images run `{download_command(DEFAULT_MODEL)}` once on a machine with network "
    "access, then restart with `streamstudio serve` (or pass `--model` with a diffusers folder or a "
    ".safetensors checkpoint).")


def model_banner(manager: SessionManager) -> str:
    model = manager.model
    w, h = model.size
    text = f"**Model:** `{model.name}` · {w}x{h} · up to {manager.max_streams} live stream(s)"
    comps = getattr(model, "comps", None)  # a served model's networks (stand-ins in tests have none)
    for line in comps.addon_lines() if comps is not None else []:  # LoRAs, ControlNets, IP-Adapter, scales
        text += f" · {line}"
    if model.is_demo and model.name == "tiny":
        text += ("\n\n> **Demo model.** The built-in tiny model with random weights is running (its images "
                 f"are noise-like patterns), because no real weights are available. {HOW_TO_GET_A_MODEL}")
    elif model.is_demo:
        text += ("\n\n> **Demo model.** The small built-in model is running (trained here on synthetic "
                 "images: it keeps the camera's picture and applies the colours, grading and simple styles "
                 "a prompt names, such as \"red\", \"sepia\", \"pencil sketch\"), because no real weights "
                 f"are available or no GPU is there to run them. {HOW_TO_GET_A_MODEL}")
    return text


def format_stats(stats: dict | None) -> str:
    if stats is None:
        return "Not streaming. Press the camera's **Record** button to start."
    lat = "–" if stats["latency_ms"] is None else f"{stats['latency_ms']:.0f} ms"
    text = (f"**{stats['fps']:.1f} fps** · latency {lat} (+{stats['frame_latency'] or 0} frame(s) in the batch) · "
            f"skip rate {100 * stats['skip_rate']:.0f}% · frames in {stats['frames_in']}, "
            f"processed {stats['processed']}, dropped {stats['dropped']}")
    batching = stats.get("batching") or {}
    if "shared_calls" in batching:
        shared, alone = batching["shared_calls"], batching["alone_calls"]
        if shared:
            text += f" · network calls shared with other streams: {shared} of {shared + alone}"
        elif alone:
            why = (" (other streams' calls could not join: other networks, condition fields or frame size)"
                   if batching.get("unjoinable_calls") else "")
            text += f" · this stream shared none of its {alone} network calls{why}"
    ip = stats.get("ip_adapter")
    if ip:
        text += f" · IP-Adapter scale {ip['scale']:g}" + (" (own reference)" if ip["own_reference"] else "")
    if stats["notice"]:
        text += f"\n\n⚠️ {stats['notice']}"
    if stats["error"]:
        text += f"\n\n❌ The stream stopped: {stats['error']}"
    return text


def live_id(webrtc_value) -> str | None:
    """The WebRTC component's value is its webrtc_id once a stream started."""
    if isinstance(webrtc_value, str) and webrtc_value and webrtc_value != "__webrtc_value__":
        return webrtc_value
    return getattr(webrtc_value, "webrtc_id", None)


# ---------------------------------------------------------------------- the app
def theme():
    """Gradio's default look with the machine's own fonts: its theme fetches Source Sans Pro from
    fonts.googleapis.com on every page load, a request to Google from the audience's browser (and
    a failed DNS lookup on an offline stage)."""
    return gr.themes.Default(font=["ui-sans-serif", "system-ui", "sans-serif"],
                             font_mono=["ui-monospace", "Consolas", "monospace"])


def build_ui(manager: SessionManager, rtc_config: dict | None = None, outputs: Outputs | None = None,
             file_ttl: int = 300, host: str | None = None, video_model: str | None = None):
    """The app's Blocks. Files Gradio keeps for it (uploads, cached frames) are deleted `file_ttl`
    seconds after they were made, checked every minute, and all of them when the server stops.
    `host`: the address the server binds, where the Live tab's WebRTC media go; `outputs`: the
    server's live outputs (app/web/outputs.py), which the Live output tab starts and stops;
    `video_model`: one more model for the Video tab (serve --video-model)."""
    outputs = outputs if outputs is not None else Outputs(manager)
    extra_tabs = optional_tabs(manager, video_model)
    with gr.Blocks(title="StreamStudio", analytics_enabled=False, css=CSS, theme=theme(),
                   delete_cache=(min(60, file_ttl), file_ttl)) as demo:
        demo.load(None, js=CAMERA_JS)
        gr.Markdown("# StreamStudio")
        gr.Markdown(model_banner(manager), elem_id="model-banner")
        with gr.Tabs():
            with gr.Tab("Live", id="live"):
                webrtc = _live_tab(manager, rtc_config, host)
            with gr.Tab("Text to image", id="t2i"):
                _t2i_tab(manager)
            with gr.Tab("Live output", id="output"):
                _output_tab(manager, outputs, webrtc)
            for label, tab_id, build in extra_tabs:
                with gr.Tab(label, id=tab_id):
                    build()
    return demo


def _live_tab(manager: SessionManager, rtc_config: dict | None, host: str | None):
    rtc_config = explicit_rtc_config(rtc_config)
    with gr.Row():
        with gr.Column(scale=3):
            webrtc = live_component(manager, host, label="Webcam → StreamStudio", mode="send-receive",
                                    modality="video", rtc_configuration=rtc_config,
                                    server_rtc_configuration=rtc_config, full_screen=False, elem_id="live-webrtc",
                                    track_constraints=CAMERA_CONSTRAINTS)
            gr.HTML('<div id="live-camera-note" role="alert"></div>', elem_id="live-camera-message", padding=False)
            stats = gr.Markdown(format_stats(None), elem_id="live-stats")
            whep = gr.Markdown("", elem_id="live-whep")
            with gr.Accordion("Deck B (POST /studio/streams/{stream}/deck)", open=False):
                deck_image = gr.Image(label="deck B's preview", interactive=False, elem_id="live-deck-b", height=200)
                deck_line = gr.Markdown("no deck loaded", elem_id="live-deck-state")
        with gr.Column(scale=2):
            controls = live_controls(manager.model.config, manager.model.prompt, manager.model.negative_prompt)
            controls |= addon_controls(manager.model)  # ControlNet and IP-Adapter scales: with the controls above
            _ip_adapter_controls(manager, webrtc)
            _lora_controls(manager)
            midi_controls(manager, webrtc, live_id)
            mapping_controls(manager, webrtc, live_id)  # audio features, LFOs and the beat onto any setting
    # The component checks nothing itself beyond a generous cap; the session manager says "busy".
    webrtc.stream(LiveHandler(manager, tuple(controls)), inputs=[webrtc, *controls.values()], outputs=[webrtc],
                  concurrency_limit=2 * manager.max_streams + 2)
    timer = gr.Timer(1.0)
    timer.tick(lambda value: format_stats(_stats(manager, live_id(value))), inputs=[webrtc], outputs=[stats],
               show_progress="hidden", queue=False)

    def whep_url(value, request: gr.Request):
        return whep_text(manager, live_id(value), request)

    timer.tick(whep_url, inputs=[webrtc], outputs=[whep], show_progress="hidden", queue=False)

    def deck_b(value):  # deck B's newest frame while one is loaded beside the page's stream (app/web/decks.py)
        sid = live_id(value)
        image, line = deck_preview(manager.get(sid) if sid else None)
        return image, line or "no deck loaded"

    timer.tick(deck_b, inputs=[webrtc], outputs=[deck_image, deck_line], show_progress="hidden", queue=False)
    _fallback(manager, controls)
    return webrtc


# ---------------------------------------------------------------------- the model's add-ons
def addon_controls(model) -> dict:
    """The Live tab's add-on sliders: {control_scale_key(i): slider}, one per ControlNet of the
    served model, labelled with its id and preprocessor and starting at the scale streams start
    from, and with an IP-Adapter its scale slider {IP_ADAPTER_SCALE: slider}; none without
    add-ons. They go to the session with the Live tab's other controls (`settings_from_ui` makes
    the ControlNet sliders one control_scales list): each session's own scales (per-row scales:
    other streams keep theirs)."""
    comps = getattr(model, "comps", None)  # (stand-ins in tests have none)
    nets = list(getattr(comps, "controlnets", None) or [])
    defaults = (getattr(comps, "control_defaults", None) or [("canny", 1.0)] * len(nets))
    sliders = {}
    for i, (net, (kind, scale)) in enumerate(zip(nets, defaults)):
        name = getattr(getattr(net, "config", None), "_name_or_path", "") or type(net).__name__
        sliders[control_scale_key(i)] = widget(ADDON_SCALE, scale, elem_id=f"live-control-scale-{i}",
                                               label=f"ControlNet {i + 1}: {name} ({kind}) conditioning scale")
    ip = getattr(comps, "ip_adapter", None)
    if ip is not None:
        gr.Markdown(f"**IP-Adapter** `{ip.source}`: a reference picture steers your stream's images. The scale "
                    "and the reference are your stream's own; other streams keep theirs.", elem_id="live-ip-note")
        sliders[IP_ADAPTER_SCALE] = widget(ADDON_SCALE, ip.scale, label="IP-Adapter scale (your stream)",
                                           elem_id="live-ip-scale")
    return sliders


def _ip_adapter_controls(manager: SessionManager, webrtc) -> None:
    """The IP-Adapter's reference picture of the user's own stream (an upload, or the camera's
    current frame); nothing without an IP-Adapter."""
    ip = getattr(getattr(manager.model, "comps", None), "ip_adapter", None)
    if ip is None:
        return
    with gr.Group(elem_id="live-ip-adapter"):
        reference = gr.Image(sources=["upload"], type="numpy", label="Reference picture (your stream)", height=160,
                             elem_id="live-ip-reference")
        grab = gr.Button("Use the camera's current frame as the reference", elem_id="live-ip-grab")
        status = gr.Markdown("", elem_id="live-ip-status")

    def sids(value, request: gr.Request):  # the page's own streams (a foreign stream id is left out)
        sid = live_id(value)
        own = sid if may_control(manager, sid, request.session_hash, operator(request)) else None
        return [own, f"fallback-{request.session_hash}"]

    def grab_frame(value, request: gr.Request):
        image, text = grab_reference(manager, sids(value, request))
        return (gr.update() if image is None else image), text

    def upload(image, value, request: gr.Request):
        return set_ip_adapter(manager, sids(value, request), reference=image)

    reference.upload(upload, inputs=[reference, webrtc], outputs=[status])
    grab.click(grab_frame, inputs=[webrtc], outputs=[reference, status])


def _lora_controls(manager: SessionManager) -> None:
    """A scale slider per loaded LoRA, marked "all streams": the LoRAs are fused into the shared
    weights, so a scale is the server's (applied between frames); nothing without LoRAs."""
    listing = manager.model.lora_listing() if hasattr(manager.model, "lora_listing") else []
    if not listing:
        return
    with gr.Group(elem_id="live-lora"):
        sliders = [widget(ADDON_SCALE, scale, elem_id=f"live-lora-scale-{i}",
                          label=f"LoRA {source} scale (all streams)")
                   for i, (source, scale) in enumerate(listing)]
        status = gr.Markdown("The LoRAs are fused into the server's model: their scales change every stream.",
                             elem_id="live-lora-status")
    def setter(source: str):
        return lambda value: set_lora_scale(manager, source, value)

    for (source, _), slider in zip(listing, sliders):
        slider.release(setter(source), inputs=[slider], outputs=[status])


def set_lora_scale(manager: SessionManager, source: str, scale) -> str:
    """One LoRA's scale, server-wide (every stream; applied between frames); what the page says."""
    try:
        listing = manager.set_lora_scales({source: float(scale)})
    except StreamStudioError as exc:
        return f"⚠️ {exc}"
    return "LoRA scales for all streams: " + ", ".join(f"`{s}` × {v:g}" for s, v in listing)


def _own_session(manager: SessionManager, sids) -> StreamSession | None:
    """The first running session of `sids` (the Live tab's WebRTC stream, then its fallback)."""
    for sid in sids:
        session = manager.get(sid) if sid else None
        if session is not None and not session.closed:
            return session
    return None


def set_ip_adapter(manager: SessionManager, sids, scale=None, reference=None) -> str:
    """Set the IP-Adapter scale and/or reference picture (any image; its embedding is computed
    here, once per new picture) of the user's own stream: the first running session of `sids`.
    Other streams keep theirs. Returns what the page says."""
    if getattr(manager.model.comps, "ip_adapter", None) is None:
        return "⚠️ This model has no IP-Adapter (serve --ip-adapter ID)."
    session = _own_session(manager, sids)
    if session is None:
        return "⚠️ Start the Live tab's camera first: the reference picture is your stream's own."
    try:
        if scale is not None:
            manager.settings(session.sid, {IP_ADAPTER_SCALE: scale})
        if reference is not None:
            session.set_reference(reference)
    except StreamStudioError as exc:
        return f"⚠️ {exc}"
    return "Reference set for your stream (other streams keep theirs)." if reference is not None else \
        "IP-Adapter scale set for your stream."


def grab_reference(manager: SessionManager, sids) -> tuple[np.ndarray | None, str]:
    """The newest camera frame of the user's own stream (the first running session of `sids`)
    as its IP-Adapter reference: (that frame, status), or (None, why not)."""
    session = _own_session(manager, sids)
    if session is None or session.last_frame is None:
        return None, "⚠️ No camera picture yet: start the Live tab's camera first."
    frame = session.last_frame.copy()
    return frame, set_ip_adapter(manager, [session.sid], reference=frame)


def whep_text(manager: SessionManager, sid: str | None, request=None) -> str:
    """The running stream's WHEP URL (app/web/whip.py): any number of players can watch its output.
    It names the stream's watch id, never the id that controls it."""
    session = manager.get(sid) if sid else None
    if session is None:
        return ""
    base = str(getattr(request, "base_url", "") or "").rstrip("/") if request is not None else ""
    return (f"Watch this stream in a WHEP player (any number of viewers, one model run): "
            f"`{base}/whep/{session.watch_id}` "
            "(with the server's WHIP token as the bearer token, when it has one)")


def _stats(manager: SessionManager, sid: str | None) -> dict | None:
    session = manager.get(sid) if sid else None
    return session.stats() if session is not None else None


def _fallback(manager: SessionManager, controls: dict) -> None:
    """Gradio's own streaming webcam, for networks where WebRTC cannot connect."""
    with gr.Accordion("No picture? Use the plain webcam stream (when WebRTC cannot connect)", open=False):
        gr.Markdown("This path sends webcam snapshots over Gradio's own connection: slower than WebRTC, "
                    "but it works wherever the page loads. Set STREAMSTUDIO_TURN_URLS on the server to make "
                    "WebRTC work across networks.")
        with gr.Row():
            cam = gr.Image(sources=["webcam"], streaming=True, type="numpy", label="Webcam")
            out = gr.Image(label="StreamStudio", streaming=True, elem_id="fallback-output", height=360,
                           elem_classes=["scaled-up"])
        status = gr.Markdown("")

    def step(request: gr.Request, frame, *values):
        # Gradio hands gr.Request to a positional parameter before *values
        image, text = fallback_step(manager, f"fallback-{request.session_hash}", frame, values, tuple(controls))
        return (gr.update() if image is None else image), text

    cam.stream(step, inputs=[cam, *controls.values()], outputs=[out, status], stream_every=0.1,
               concurrency_limit=manager.max_streams, show_progress="hidden")


def fallback_step(manager: SessionManager, sid: str, frame, values,
                  keys: tuple[str, ...] = LIVE_KEYS) -> tuple[np.ndarray | None, str]:
    """One webcam snapshot of the fallback path: hand it in (`values` of the controls `keys`),
    return (latest output, status)."""
    try:
        session = manager.open(sid)
        manager.settings(sid, settings_from_ui(keys, values))
    except StreamStudioError as exc:  # busy, or a bad setting
        return None, f"⚠️ {exc}"
    if frame is not None:
        session.submit(np.ascontiguousarray(np.asarray(frame, dtype=np.uint8)[:, :, :3]))
    return session.latest(), format_stats(session.stats())


def t2i_step(manager: SessionManager, sid: str, prompts, weights, negative: str, seed) -> tuple:
    """One text-to-image tick: settings in, ask for a new image, return (latest image or None,
    status, keep ticking). Busy stops the ticking; a bad setting is shown and ticking goes on."""
    try:
        session = manager.open(sid, mode="txt2img")
        manager.settings(sid, {"prompt": blend_spec(prompts, weights), "negative_prompt": negative or "",
                               "seed": int(seed or 0)})
    except BusyError as exc:
        return None, f"⚠️ {exc}", False
    except StreamStudioError as exc:
        return None, f"⚠️ {exc}", True
    session.submit(None)
    return session.latest(), format_stats(session.stats()), True


def blend_spec(prompts, weights) -> str | list[tuple[str, float]]:
    """The txt2img prompt: one prompt, or up to three blended by their slider weights."""
    pairs = [(p.strip(), float(w)) for p, w in zip(prompts, weights) if p and p.strip() and float(w) > 0]
    if not pairs:
        return ""
    return pairs[0][0] if len(pairs) == 1 else pairs


def _t2i_tab(manager: SessionManager) -> None:
    gr.Markdown(f"Press **Start**: until **Stop**, a new image is drawn every {T2I_TICK_S:g} s from the prompts as "
                "they stand (txt2img Stream Batch), so an edit shows in the next image; typing does not start it. "
                "Blend up to three prompts with the sliders.")
    with gr.Row():
        with gr.Column():
            prompts, weights = [], []
            for i, default in enumerate([manager.model.prompt or "a watercolor landscape", "", ""]):
                with gr.Row():
                    prompts.append(widget(SETTINGS["prompt"], default, label=f"Prompt {i + 1}", scale=3, lines=1,
                                          elem_id=f"t2i-prompt-{i + 1}"))
                    weights.append(gr.Slider(0.0, 1.0, value=1.0 if i == 0 else 0.5, step=0.05,
                                             label="weight", scale=1))
            negative = widget(SETTINGS["negative_prompt"], manager.model.negative_prompt)
            seed = widget(SETTINGS["seed"], manager.model.config.seed)
            with gr.Row():
                start = gr.Button("Start", variant="primary")
                stop = gr.Button("Stop")
        with gr.Column():
            image = gr.Image(label="Text to image", elem_id="t2i-image", interactive=False, height=420,
                             elem_classes=["scaled-up"])
            status = gr.Markdown("")
    timer = gr.Timer(T2I_TICK_S, active=False)
    inputs = [*prompts, *weights, negative, seed]
    control = T2IControl(manager)

    def tick(p1, p2, p3, w1, w2, w3, negative, seed, request: gr.Request):
        image, text, keep_going = control.tick(request.session_hash, (p1, p2, p3), (w1, w2, w3), negative, seed)
        return (gr.update() if image is None else image), text, gr.Timer(active=keep_going)

    def begin(request: gr.Request):
        return gr.Timer(active=control.start(request.session_hash))

    def typed(request: gr.Request):
        return gr.Timer(active=control.typed(request.session_hash))

    def halt(request: gr.Request):
        control.stop(request.session_hash)
        return gr.Timer(active=False), "Stopped."

    timer.tick(tick, inputs=inputs, outputs=[image, status, timer], show_progress="hidden",
               concurrency_limit=None, trigger_mode="always_last")
    start.click(begin, outputs=[timer])
    for box in prompts:
        box.input(typed, outputs=[timer], queue=False)
    stop.click(halt, outputs=[timer, status])


class T2IControl:
    """Start, Stop and typing in the Text to image tab, per browser session. Stop holds until
    Start is pressed again: a tick already on its way when Stop is pressed, or typing while it
    is stopped, does not bring it back (typing into a prompt while it generated once made Stop
    stop nothing)."""

    def __init__(self, manager: SessionManager):
        self.manager = manager
        self.running: set[str | None] = set()  # the running pages (Gradio session hashes)
        self._lock = threading.Lock()

    def start(self, key: str | None) -> bool:
        with self._lock:
            self.running.add(key)
        return True

    def typed(self, key: str | None) -> bool:
        """Typing keeps a running tab running; it does not start a stopped one."""
        return key in self.running

    def stop(self, key: str | None) -> None:
        with self._lock:
            self.running.discard(key)
        self.manager.close(f"t2i-{key}", wait=0.0)

    def tick(self, key: str | None, prompts, weights, negative: str, seed) -> tuple:
        if key not in self.running:
            return None, "Stopped.", False
        image, text, keep_going = t2i_step(self.manager, f"t2i-{key}", prompts, weights, negative, seed)
        with self._lock:
            stopped = key not in self.running
            if not keep_going:
                self.running.discard(key)
        if stopped:  # Stop came while this tick ran: what it opened goes too
            self.manager.close(f"t2i-{key}", wait=0.0)
            return None, "Stopped.", False
        return image, text, keep_going


LIVE = "live"  # the Live output tab's stream choice for the page's own Live-tab camera
NOT_YOURS = ("⚠️ That stream is not this page's: only the page that started it (or a logged-in operator) can "
             "record, push or steer it.")


def _output_tab(manager: SessionManager, outputs: Outputs, webrtc) -> None:
    gr.Markdown("Push a live stream to an RTMP server or HLS, send it as an NDI source (TouchDesigner, OBS, vMix, "
                "Resolume on the network see it by name), or record it to a file on the server (files go to the "
                f"server's output folder, `{outputs.output_dir}`). A page outputs its own Live-tab camera; a "
                "logged-in operator (`serve --auth`) any running stream: WHIP publishers such as OBS, "
                f"`serve --input`, other pages. Up to {outputs.limits.per_stream} outputs a stream; scripts use "
                "`POST /studio/outputs/{stream}`.")
    with gr.Row():
        # (choices change each second: allow_custom_value lets a choice made from them through Gradio's
        # check against the first ones; _start_output checks what a page may output)
        stream = gr.Dropdown([("This page's Live camera", LIVE)], value=LIVE, label="Stream",
                             elem_id="output-stream", allow_custom_value=True)
        kind = gr.Radio(["file", "rtmp", "hls", "ndi"], value="file", label="Output")
        target = gr.Textbox(label="File name, RTMP URL, HLS stream name or NDI source name", value="recording.mp4")
        fps = gr.Slider(5, 60, value=30, step=1, label="Output fps")
    with gr.Row():
        start = gr.Button("Start", variant="primary")
        which = gr.Dropdown([], label="Output to stop", elem_id="output-which", allow_custom_value=True)
        stop = gr.Button("Stop")
    status = gr.Markdown("Not running.", elem_id="output-status")
    said: dict[str | None, str] = {}  # the last thing Start or Stop said to each browser session

    def begin(value, chosen, kind_, target_, fps_, request: gr.Request):
        sid = live_id(value) if chosen in (None, "", LIVE) else chosen
        said[request.session_hash] = _start_output(manager, outputs, request.session_hash, sid, kind_, target_,
                                                   float(fps_), operator(request))
        return said[request.session_hash]

    def end(oid, request: gr.Request):
        said[request.session_hash] = _stop_output(outputs, request.session_hash, oid, operator(request))
        return said[request.session_hash]

    start.click(begin, inputs=[webrtc, stream, kind, target, fps], outputs=[status])
    stop.click(end, inputs=[which], outputs=[status])

    def refresh(value, chosen, oid, request: gr.Request):
        page, op = request.session_hash, operator(request)
        sid = live_id(value) if chosen in (None, "", LIVE) else chosen
        streams = _tab_streams(manager, op)
        mine = _visible_outputs(manager, outputs, page, sid, op)
        stoppable = [(_output_label(o), o.oid) for o in mine]
        keep = oid if oid in {v for _, v in stoppable} else (stoppable[-1][1] if stoppable else None)
        return (gr.update(choices=streams, value=chosen if chosen in {v for _, v in streams} else LIVE),
                gr.update(choices=stoppable, value=keep), _tab_status(mine, said.get(page)))

    gr.Timer(1.0).tick(refresh, inputs=[webrtc, stream, which], outputs=[stream, which, status],
                       show_progress="hidden", queue=False)


def _tab_streams(manager: SessionManager, operator: bool) -> list[tuple[str, str]]:
    """The stream choices of the Live output tab: the page's own camera, and for an operator every
    running stream by its id (a WHIP publisher's name, `serve --input`'s, another page's)."""
    choices = [("This page's Live camera", LIVE)]
    if operator:
        choices += [(sid, sid) for sid in manager.ids()]
    return choices


def _visible_outputs(manager: SessionManager, outputs: Outputs, page: str | None, sid: str | None,
                     operator: bool = False) -> list[LiveOutput]:
    """The outputs of stream `sid` this page may see and stop: every one for a page that may
    control the stream (its own, or an operator's), else only those it started."""
    if not sid:
        return []
    everyone = may_control(manager, sid, page, operator)
    return [o for o in outputs.of(sid) if everyone or o.owner == page]


def _start_output(manager: SessionManager, outputs: Outputs, page: str | None, sid: str | None, kind: str, target: str,
                  fps: float, operator: bool = False) -> str:
    """Start page `page`'s output of stream `sid` (its own stream, or any with `operator`)."""
    session = manager.get(sid) if sid else None
    if session is None or session.closed:
        return "⚠️ No live stream: start the Live tab's camera first" + (
            " (or pick another running stream)." if operator else ".")
    if not may_control(manager, sid, page, operator):
        return NOT_YOURS
    try:
        out = outputs.start(session.sid, kind, target, fps, owner=page)
    except OutputRefused as exc:
        return f"⚠️ Could not start the output: {exc}"
    return f"Started: {kind} → `{out.location}`"


def _stop_output(outputs: Outputs, page: str | None, oid: str | None, operator: bool = False) -> str:
    out = outputs.get(oid) if oid else None
    if out is None:
        return "Not running."
    if out.owner != page and not operator and not may_control(outputs.manager, out.sid, page):
        return NOT_YOURS
    try:
        outputs.stop(out.oid)
    except OutputRefused:  # stopped meanwhile (another page, the API)
        return "Not running."
    a = out.attachment
    text = f"Stopped: {a.frames} frame(s) at a constant {a.fps:g} fps → `{out.location}`"
    return text + (f". It had failed: {a.error}" if a.error else ".")


def _tab_status(mine: list[LiveOutput], said: str | None) -> str:
    """What the status line shows each second: each visible output's status, then the last thing
    Start or Stop said (an error, where the recording went), else "Not running."."""
    lines = [_output_status(o) for o in mine]
    if said and not (lines and said.startswith("Started")):
        lines.append(said)
    return "\n\n".join(lines) or "Not running."


def _output_label(out: LiveOutput) -> str:
    return f"{out.kind} → {out.location}" + ("" if out.running else " (stopped)")


def _output_status(out: LiveOutput | None) -> str:
    if out is None:
        return "Not running."
    a = out.attachment
    if a.error:
        return f"❌ Stopped: {a.error} ({out.location})"
    state = "running" if a.running else "stopped"
    st = a.sink.status
    text = f"**{state}** → `{out.location}` · {a.frames} frame(s) written"
    if a.ended and not a.running:
        text += " · the live stream ended"
    text += f" · lost {st.frames_lost} · reconnects {st.reconnects}"
    if st.error:
        text += f" · last error: {st.error}"
    return text


def optional_tabs(manager: SessionManager, video_model: str | None = None
                  ) -> list[tuple[str, str, Callable[[], object]]]:
    """(label, id, build) of the Video and Splats tabs whose modules are in this build and build
    on their own (checked outside the app, so a broken tab is left out, never the whole app)."""
    tabs: list[tuple[str, str, Callable[[], object]]] = []
    try:
        from streamstudio.app.web.video_tab import build_video_tab
    except ImportError:
        pass
    else:
        tabs.append(("Video", "video", lambda: build_video_tab(slots=manager, extra_model=video_model)))
    try:
        from streamstudio.app.web.splat_tab import build_splat_tab
    except ImportError:
        pass
    else:
        shared = lambda: GuardedPipeline(manager.model.build("img2img"), manager.model.guard)  # noqa: E731
        tabs.append(("Splats", "splats", lambda: build_splat_tab(get_image_pipeline=shared, slots=manager)))
    return [tab for tab in tabs if _builds(tab[0], tab[2])]


def _builds(name: str, build) -> bool:
    try:
        with gr.Blocks(analytics_enabled=False):
            build()
    except Exception:
        log.exception("the %s tab does not build; it is left out of the app", name)
        return False
    return True
