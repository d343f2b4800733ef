"""`streamstudio render`'s runner: a batch of files (app/batch/cluster.py), the video pipeline
(render_video.py) or the image pipeline from one input to one output on streaming.Runner. Its
parser, the config file and the checks said before the model loads are in render.py."""

from __future__ import annotations

import importlib
import logging
import os
import sys

from streamstudio.app import streams
from streamstudio.app.batch.cluster import run_batch, wants_batch
from streamstudio.app.cli.requests import batch_request, image_request
from streamstudio.app.perform.file_audio import FileAudio, NdiAudio
from streamstudio.app.perform.modulation import apply_at, load_modulations
from streamstudio.app.perform.tempo import TempoClock
from streamstudio.app.streams import FittedFrames, expected_frames, rtmp_config, watch
from streamstudio.errors import StreamStudioError
from streamstudio.streaming.resample import resample_file
from streamstudio.streaming.runner import Runner, RunnerConfig
from streamstudio.streaming.schedule import load_schedule
from streamstudio.streaming.sinks import open_sink
from streamstudio.streaming.sources import NdiSource, open_source

log = logging.getLogger(__name__)

VIDEO_MODULE = "streamstudio.app.cli.render_video"
# settings handed to the video pipeline's render (`run_video_render(args)`)
VIDEO_ARGS = ("prompt", "input", "output", "frames", "seed", "width", "height", "fps", "model", "max_frames",
              "device", "dtype", "acceleration")


def run(args) -> int:
    """The render, once render.check passed: a batch (app/batch/cluster.py), the video pipeline,
    or the image pipeline over one input."""
    request = batch_request(args)
    if wants_batch(request):  # many files, or one in segments, on Ray or one after another
        return run_batch(request)
    if args.pipeline == "video":
        return _run_video(args)
    return _run_image(args)


def _run_video(args) -> int:
    try:  # imported by name, here: an installation may lack it or one of its dependencies
        module = importlib.import_module(VIDEO_MODULE)
        why = None if hasattr(module, "run_video_render") else f"{VIDEO_MODULE}.run_video_render is missing"
    except ImportError as exc:
        log.debug("%s not available: %s", VIDEO_MODULE, exc)
        why = str(exc)
    if why is not None:
        raise StreamStudioError(f"--pipeline video is not available in this installation ({why}); "
                                "use --pipeline image")
    for name in VIDEO_ARGS:
        if not hasattr(args, name):
            setattr(args, name, None)
    return int(module.run_video_render(args) or 0)


def _run_image(args) -> int:
    schedule = load_schedule(args.prompt_schedule, args.transition) if args.prompt_schedule else None
    mods = None
    file_audio: FileAudio | NdiAudio | None = None  # what the audio sources read: the input's own sound
    if args.modulation:
        mods, clock = load_modulations(args.modulation), TempoClock(args.bpm, origin=0.0)
    realtime = args.mode != "offline"
    source = open_source(args.input, fps=args.fps, realtime=realtime)
    try:
        source = resample_file(source, args.fps)
        live = source.info.live if args.mode == "auto" else args.mode == "live"
        aspect = source.info.width / source.info.height if source.info.width and source.info.height else None
        pipe = FittedFrames(streams.build_pipeline(image_request(args), "img2img", aspect=aspect),
                            getattr(args, "fit", "crop"))
        if schedule is not None:
            schedule.check(pipe)  # its scales fit the model's ControlNets and IP-Adapter
        if mods is not None and mods.uses("audio"):
            period = 1.0 / (args.fps or source.info.fps or 30.0)
            if isinstance(source, NdiSource):  # a live NDI input's own sound, on its frames' clock
                file_audio = NdiAudio(source, period)
            elif source.info.live or not os.path.isfile(args.input):
                raise StreamStudioError("--modulation maps an audio feature: render reads it from the input file's "
                                        "or NDI source's own audio (another live input's sound reaches the server as "
                                        "a WHIP stream)")
            else:
                file_audio = FileAudio(args.input, period)
        if mods is not None and pipe.latency_frames and any(m.setting == "strength" for m in mods.mappings):
            raise StreamStudioError("--modulation: strength picks the denoising steps, and a new step re-makes the "
                                    "Stream Batch buffer, losing the frames in it; in a render modulate guidance, "
                                    "delta or seed, or render with --steps 1")
        fps = args.fps or source.info.fps
        # a file keeps its audio in live mode too: output frames carry their input's timestamps, so
        # the audio stays in step where frames were dropped (live inputs have none to copy)
        audio = None if (args.no_audio or source.info.live) else source.info.audio
        sink = open_sink(args.output, pipe.config.width, pipe.config.height, fps, audio_from=audio,
                         rtmp=rtmp_config(args.rtmp_timeout))
    except BaseException:
        source.close()
        if file_audio is not None:
            file_audio.close()
        raise

    def on_input(pts: float) -> None:  # between frames: the schedule's prompt and scales, the modulations
        if schedule is not None:
            schedule.apply_to(pipe, pts)
        if mods is not None:
            apply_at(pipe, mods, clock, pts, file_audio)
    fitted = "" if aspect is None or abs(aspect - pipe.config.width / pipe.config.height) < 0.01 else f" ({args.fit})"
    print(f"render: {source.info.description} -> {args.output} ({'live' if live else 'offline'}, "
          f"{pipe.config.width}x{pipe.config.height}{fitted} @ {fps:g} fps, model {pipe.comps.name}, "
          f"frame latency {pipe.latency_frames})", file=sys.stderr)
    runner = Runner(source, pipe, sink, RunnerConfig(live=live, max_frames=args.max_frames),
                    on_input=on_input if schedule is not None or mods is not None else None)
    total = expected_frames(source.info.frame_count, args.max_frames)
    try:
        metrics = watch(runner, total, live=live)
    except KeyboardInterrupt:
        runner.stop()
        try:
            runner.wait(15)
        finally:
            print(f"\ninterrupted: {runner.metrics().frames_out} frame(s) written, {args.output} closed",
                  file=sys.stderr)
        return 130
    finally:
        if file_audio is not None:
            file_audio.close()
    for warning in metrics.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"done: {metrics.summary()}", file=sys.stderr)
    print(f"wrote {args.output}")
    return 0

