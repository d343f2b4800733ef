"""Batch rendering of many files, or of one long file in segments, on a Ray cluster or here.

`streamstudio render --input DIR|GLOB|a.mp4,b.mp4|@list.txt --output DIR --cluster auto|local|ray://HEAD:10001`
(`--workers N` starts a local Ray with N workers). One worker per GPU (a Ray actor with
num_gpus=1; CPU actors where there are no GPUs) loads the model once and renders many jobs. A
job is a whole file, or a segment of a long one (`app/batch/segments.py`: warm-up, keyframe cuts,
stitching), so the outputs are the frames a local render of each file gives. With --pipeline
video a job is always a whole file (app/batch/video.py: a video stream's state runs through it).

- Resumable: outputs are written under a temporary name and renamed when complete; the job
  list (`DIR/.streamstudio-batch/jobs.json`, with the settings it was made with) records them,
  and a run again skips finished outputs and finished segments.
- A worker that dies (killed, out of memory, its machine lost) has its job run again on
  another worker (a new one is started in its place); a bad input file fails its own job,
  is reported in the summary, and the others go on.
- Without Ray (`pip install "streamstudio[ray]"`), or with --cluster local, the jobs run one
  after another in this process.

Ray moves only file paths and small results: the workers read the inputs and write the
outputs on storage every machine sees (docs/cluster.md).
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamstudio.app.batch import video
from streamstudio.app.batch.segments import (MIN_SEGMENT, Piece, keyframe_indices, part_done, plan_pieces, remove_parts,
                                       render_piece, split_allowed, stitch, write_json)
from streamstudio.app.batch.worker import PieceResult, Worker
from streamstudio.app.settings import number
from streamstudio.app.streams.requests import BatchRequest
from streamstudio.errors import StreamStudioError
from streamstudio.streaming.sources import open_source

if TYPE_CHECKING:  # (torch and the model load in the workers)
    from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion

VIDEO_SUFFIXES = (".mp4", ".mkv", ".mov", ".webm", ".avi", ".m4v", ".flv", ".ts", ".mpg", ".mpeg", ".wmv")
WORK_DIR = ".streamstudio-batch"  # the job list, segment parts and unfinished outputs, beside the outputs
MAX_ATTEMPTS = 3  # a job whose worker died this many times is reported as failed
SCALE_OUT = ("to render on several GPUs or machines: pip install 'streamstudio[ray]', then --workers N "
             "(this machine) or --cluster ray://HEAD:10001 (docs/cluster.md)")
# settings that do not change what a job renders (left out of the job list's fingerprint)
NOT_RENDERING = ("input", "output", "cluster", "workers", "segment_frames", "config", "device", "threads", "verbose",
                 "command", "func")


def add_arguments(group) -> None:
    """render's batch options (`group`: its input and output group)."""
    group.add_argument("--cluster", default=None, metavar="auto|local|ray://ADDRESS",
                       help="render many files (--input a folder, a glob, a,b,c or @list.txt) or one long file in "
                            "segments: on a Ray cluster (ray://HEAD:10001, or auto: RAY_ADDRESS or a local Ray "
                            "when --workers or several GPUs ask for one) or here, one job after another (local)")
    group.add_argument("--workers", type=number(int, 1, 4096), default=None,
                       help="batch workers: starts a local Ray with N workers (default: one per GPU, else one)")
    group.add_argument("--segment-frames", type=number(int, 1, 10**9), default=None,
                       help="batch: a file of at least twice this many frames is cut into segments of about this "
                            "many, rendered in parallel and stitched (default: one segment per worker for files of "
                            f"at least {MIN_SEGMENT} frames per worker; --pipeline image only: a video stream "
                            "renders each file whole)")


# ---------------------------------------------------------------------------- inputs and outputs
def batch_inputs(spec: str | None) -> list[Path] | None:
    """The files a batch --input names, or None when it is no batch form (one file, a folder or
    glob of images, a webcam, ...): a folder or glob that holds video files, `a.mp4,b.mp4`, or
    `@list.txt` (one path a line)."""
    if not spec:
        return None
    spec = str(spec).strip()
    if spec.startswith("@"):
        listing = Path(spec[1:]).expanduser()
        if not listing.is_file():
            raise StreamStudioError(f"input list {listing} does not exist")
        lines = [ln.split("#", 1)[0].strip() for ln in listing.read_text(encoding="utf-8").splitlines()]
        files = [Path(ln).expanduser() for ln in lines if ln]
        if not files:
            raise StreamStudioError(f"input list {listing} names no files")
        return files
    if "," in spec and "://" not in spec and not Path(spec).exists():  # (a stream URL may hold commas)
        return [Path(p.strip()).expanduser() for p in spec.split(",") if p.strip()]
    path = Path(spec).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in VIDEO_SUFFIXES)
        return files or None  # a folder of images: one clip
    if any(c in spec for c in "*?["):
        files = sorted(Path(p) for p in glob.glob(str(path)) if Path(p).is_file())
        return files if any(p.suffix.lower() in VIDEO_SUFFIXES for p in files) else None
    return None


def wants_batch(request: BatchRequest) -> bool:
    """Whether `render` hands this run to the batch renderer."""
    if request.cluster is not None or request.workers is not None:
        return True
    return batch_inputs(request.input) is not None  # (--pipeline video without --input: text-to-video)


def output_paths(inputs: list[Path], output: str) -> tuple[list[Path], Path]:
    """Each input's output and the work folder. One input may go to a video file; otherwise
    --output is a folder and each input gets its name there (its container, else .mp4)."""
    from streamstudio.streaming.sinks import VIDEO_CODECS, make_output_folder

    out = Path(output).expanduser()
    if out.suffix.lower() in VIDEO_CODECS:
        if len(inputs) > 1:
            raise StreamStudioError(f"--output {output} is one file for {len(inputs)} inputs; give a folder")
        make_output_folder(out.parent)
        return [out], out.parent / WORK_DIR / out.name  # its own job list: other files in the folder are not its
    if out.suffix:
        raise StreamStudioError(f"--output {output}: a batch writes video files; give a folder or an "
                                ".mp4/.mkv/.mov/.webm")
    make_output_folder(out)
    paths = [out / (p.stem + (p.suffix.lower() if p.suffix.lower() in VIDEO_CODECS else ".mp4")) for p in inputs]
    seen: dict[Path, Path] = {}
    for src, dst in zip(inputs, paths):
        if dst in seen:
            raise StreamStudioError(f"{seen[dst]} and {src} would both be written to {dst}; rename one")
        seen[dst] = src
    return paths, out / WORK_DIR


# ---------------------------------------------------------------------------- the job list
class JobList:
    """`jobs.json` in the work folder: the settings the outputs were rendered with and the
    outputs finished. Outputs already there that it does not list are never overwritten."""

    def __init__(self, work: Path, settings: dict):
        self.path = work / "jobs.json"
        self.fingerprint = {k: v for k, v in settings.items() if k not in NOT_RENDERING}
        self.done: dict[str, int] = {}
        if self.path.is_file():
            data = json.loads(self.path.read_text())
            if data.get("settings") != self.fingerprint:
                changed = sorted(k for k in set(data.get("settings", {})) | set(self.fingerprint)
                                 if data.get("settings", {}).get(k) != self.fingerprint.get(k))
                raise StreamStudioError(f"this --output holds a batch rendered with other settings "
                                        f"({', '.join(changed)}); use another --output, or delete {work} "
                                        "and its outputs to render them again")
            self.done = dict(data.get("done", {}))
        work.mkdir(parents=True, exist_ok=True)

    def finished(self, output: Path) -> bool:
        if str(output) in self.done and output.is_file():
            return True
        if output.exists():
            raise StreamStudioError(f"{output} exists and is not in this batch's job list ({self.path}); "
                                    "move it or use another --output folder")
        return False

    def record(self, output: Path, frames: int) -> None:
        self.done[str(output)] = frames
        write_json(self.path, {"settings": self.fingerprint, "done": self.done})


# ---------------------------------------------------------------------------- workers
class RenderWorker(Worker):
    """The image pipeline's worker: whole files and segments (render_piece), a stream made once per
    output size over the model loaded once."""

    def __init__(self, request: BatchRequest, name: str, board=None):
        super().__init__(request, name, board)
        self._pipes: dict[tuple[int, int], StreamDiffusion] = {}

    def _load(self) -> None:
        self._pipe_for(None)

    def _render(self, piece: Piece, target: Path, on_frame: Callable[[], None]) -> int:
        return render_piece(self._pipe_for, self.request, piece, target, on_frame=on_frame)

    def _pipe_for(self, aspect: float | None) -> StreamDiffusion:
        """A pipeline for an input of this aspect ratio; the model is loaded once, a stream is
        made once per output size."""
        from streamstudio.app.streams.image import build_pipeline, new_stream, output_size

        image = self.request.image
        if not self._pipes:
            pipe = build_pipeline(image, "img2img", aspect=aspect)
            self._pipes[(pipe.config.width, pipe.config.height)] = pipe
            return pipe
        first = next(iter(self._pipes.values()))
        size = output_size(image.width, image.height, first.comps.default_size or 512, aspect)
        if size not in self._pipes:
            if image.acceleration != "none":  # engines are built per size
                self._pipes[size] = build_pipeline(image, "img2img", aspect=aspect)
            else:
                config = replace(first.config, width=size[0], height=size[1])
                self._pipes[size] = new_stream(first.comps, config, prompt=image.prompt,
                                               negative_prompt=image.negative_prompt)
        return self._pipes[size]


class ProgressBoard:
    """Each worker's frames written (all jobs, and of the job under way), seconds busy, current
    job and process id (a Ray actor on a cluster)."""

    def __init__(self) -> None:
        self.workers: dict[str, dict] = {}

    def update(self, name: str, frames: int, job_frames: int, job: str | None, pid: int) -> None:
        entry = self.workers.setdefault(name, {"frames": 0, "busy": 0.0, "since": None, "job": None, "pid": pid})
        now = time.time()
        if entry["since"] is not None:
            entry["busy"] += now - entry["since"]
        entry.update(frames=frames, job_frames=job_frames, job=job, pid=pid, since=now if job is not None else None)

    def retire(self, name: str) -> None:
        """A lost worker: its job's frames no longer count (the job runs again elsewhere)."""
        if name in self.workers:
            self.update(name, self.workers[name]["frames"], 0, None, self.workers[name]["pid"])

    def snapshot(self) -> dict[str, dict]:
        now = time.time()
        return {name: dict(e, busy=e["busy"] + (now - e["since"] if e["since"] is not None else 0.0))
                for name, e in self.workers.items()}


# ---------------------------------------------------------------------------- executors
@dataclass
class Outcome:
    results: list[PieceResult] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # piece key -> why
    workers_lost: int = 0


class LocalExecutor:
    """The pieces one after another in this process."""

    name = "local"

    def __init__(self, request: BatchRequest):
        self.board = ProgressBoard()
        self.worker = worker_class(request)(request, "local", self.board.update)
        self.workers = 1

    def run(self, pieces: list[Piece], work: Path, on_result: Callable[[PieceResult], None],
            on_tick: Callable[[dict], None]) -> Outcome:
        outcome = Outcome()
        self.worker.ready()  # a model that does not load is one error, not one per job
        for piece in pieces:
            result = self.worker.render(piece, str(work))
            outcome.results.append(result)
            on_result(result)
            on_tick(self.board.snapshot())
        return outcome

    def close(self) -> None:
        pass


class RayExecutor:
    """One actor per GPU (CPU actors where there are none), fed from a queue; a dead actor's job
    goes back to the queue and a new actor is started in its place."""

    def __init__(self, request: BatchRequest, address: str | None, workers: int | None):
        import ray

        from streamstudio.app.ray_connect import connect_ray

        self.ray = ray
        self.started = connect_ray(address, workers or None)
        resources = ray.cluster_resources()
        self.gpus = int(resources.get("GPU", 0))
        cpus = int(resources.get("CPU", 1))
        self.workers = workers or self.gpus or max(1, cpus // 4)
        self.name = f"ray ({address or 'local'}: {self.workers} {'GPU' if self.gpus else 'CPU'} worker(s))"
        # a CPU worker takes its share of the cores, and as many torch threads (not every core of its machine)
        self.cpus = 1 if self.gpus else max(1, cpus // self.workers)
        image, clip = request.image, request.video
        if self.gpus:  # an actor sees its one GPU as cuda:0, whichever --device named
            image = replace(image, device="cuda") if str(image.device).startswith("cuda") else image
            clip = replace(clip, device="cuda") if str(clip.device).startswith("cuda") else clip
        else:
            image = image if image.threads else replace(image, threads=self.cpus)
            clip = clip if clip.threads else replace(clip, threads=self.cpus)
        self.request = replace(request, image=image, video=clip)
        # (Any: a Ray actor handle; Ray types its remote methods as the plain methods, without `.remote`)
        self.board: Any = ray.remote(num_cpus=0)(ProgressBoard).remote()
        self._actor_class = ray.remote(worker_class(request))
        self._count = 0
        self.names: dict = {}  # actor -> its name on the board
        self.actors = [self._new_actor() for _ in range(self.workers)]

    def _new_actor(self):
        name = f"w{self._count}"
        self._count += 1
        options = {"num_gpus": 1} if self.gpus else {"num_cpus": self.cpus}
        actor = self._actor_class.options(max_restarts=0, **options).remote(self.request, name,
                                                                             _RemoteBoard(self.board))
        self.names[actor] = name
        return actor

    def run(self, pieces: list[Piece], work: Path, on_result: Callable[[PieceResult], None],
            on_tick: Callable[[dict], None]) -> Outcome:
        """Jobs go to workers that have loaded the model; a worker that dies has its job queued
        again (at the front) and a new worker started in its place, which takes jobs once ready."""
        ray = self.ray
        outcome = Outcome()
        queue, attempts = deque(pieces), {p.key: 0 for p in pieces}
        idle: list[Any] = []  # ready actors (Ray actor handles)
        running: dict[Any, tuple[Any, Piece]] = {}  # job ref -> (actor, piece)
        starting = {actor.ready.remote(): actor for actor in self.actors}
        while queue or running:
            while idle and queue:
                actor, piece = idle.pop(), queue.popleft()
                attempts[piece.key] += 1
                running[actor.render.remote(piece, str(work))] = (actor, piece)
            if not running and not starting:
                raise StreamStudioError("every batch worker failed to start; see the Ray logs")
            ready, _ = ray.wait(list(running) + list(starting), num_returns=1, timeout=0.25)
            on_tick(ray.get(self.board.snapshot.remote()))
            for ref in ready:
                if ref in starting:
                    actor = starting.pop(ref)
                    try:
                        ray.get(ref)
                        idle.append(actor)
                    except ray.exceptions.RayError as exc:  # a model that does not load here is everyone's error
                        cause = getattr(exc, "cause", None)
                        if isinstance(cause, StreamStudioError):
                            raise cause from None
                        self._lose(actor, outcome)
                    continue
                actor, piece = running.pop(ref)
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayTaskError as exc:  # an unexpected error inside the job
                    why = _first_line(exc.cause if exc.cause is not None else exc)
                    idle.append(actor)
                except ray.exceptions.RayError as exc:  # the actor died (killed, out of memory, node lost)
                    why = f"its worker died ({type(exc).__name__})"
                    new = self._lose(actor, outcome)
                    if new is not None:
                        starting[new.ready.remote()] = new
                else:
                    idle.append(actor)
                    outcome.results.append(result)
                    on_result(result)
                    continue
                if attempts[piece.key] < MAX_ATTEMPTS:
                    queue.appendleft(piece)
                else:
                    outcome.failed[piece.key] = f"{why}, {MAX_ATTEMPTS} times"
        return outcome

    def _lose(self, actor, outcome: Outcome):
        """Forget a dead actor; returns the one started in its place (None after too many)."""
        outcome.workers_lost += 1
        self.actors.remove(actor)
        self.board.retire.remote(self.names.pop(actor))
        self.ray.kill(actor)
        if outcome.workers_lost > 2 * self.workers:  # something kills every worker: stop replacing them
            return None
        actor = self._new_actor()
        self.actors.append(actor)
        return actor

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)
        self.ray.kill(self.board)
        if self.started:
            self.ray.shutdown()


class _RemoteBoard:
    """A worker's view of the board actor: called like ProgressBoard.update, sent without waiting."""

    def __init__(self, board):
        self.board = board

    def __call__(self, *args) -> None:
        self.board.update.remote(*args)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def worker_class(request: BatchRequest) -> type[Worker]:
    """The worker of the request's pipeline."""
    return video.VideoWorker if request.pipeline == "video" else RenderWorker


def make_executor(request: BatchRequest):
    """The executor --cluster and --workers ask for; without Ray, the local one and a note."""
    choice, workers = request.cluster or "auto", request.workers
    if choice not in ("auto", "local") and not choice.startswith("ray://"):
        raise StreamStudioError(f"--cluster {choice!r}: use auto, local or ray://HOST:PORT")
    if choice == "local":
        return LocalExecutor(request)
    try:
        import ray  # noqa: F401
    except ImportError:
        if choice.startswith("ray://"):
            raise StreamStudioError(f"--cluster {choice} needs Ray: pip install 'streamstudio[ray]'") from None
        print(f"note: Ray is not installed, so the jobs run one after another here; {SCALE_OUT}", file=sys.stderr)
        return LocalExecutor(request)
    if choice.startswith("ray://"):
        return RayExecutor(request, choice, workers)
    if os.environ.get("RAY_ADDRESS"):
        return RayExecutor(request, os.environ["RAY_ADDRESS"], workers)
    import torch

    if workers is not None or torch.cuda.device_count() > 1:
        return RayExecutor(request, None, workers)
    print(f"note: one worker, so the jobs run one after another here; {SCALE_OUT}", file=sys.stderr)
    return LocalExecutor(request)


# ---------------------------------------------------------------------------- the batch
@dataclass
class FileJob:
    input: Path
    output: Path
    pieces: list[Piece]
    done: set[str] = field(default_factory=set)


def plan(request: BatchRequest, inputs: list[Path], outputs: list[Path], work: Path,
         workers: int) -> tuple[list[FileJob], dict[str, str]]:
    """Each input's pieces; inputs that cannot be read are failures (name -> why), not jobs."""
    from streamstudio.pipelines.image.stream_diffusion import StreamDiffusionConfig

    settings = request.image.settings  # what decides whether a file may be cut
    config = StreamDiffusionConfig(**{k: settings[k] for k in ("temporal", "feedback_weight", "bank_size")
                                      if k in settings})
    whole = video.WHOLE if request.pipeline == "video" else split_allowed(config)
    jobs, failed = [], {}
    for src, dst in zip(inputs, outputs):
        try:
            if not src.is_file():
                raise StreamStudioError(f"{src} does not exist")
            with open_source(str(src), realtime=False) as source:  # a file that opens and decodes a first frame
                fps = request.fps
                rate = (fps / source.info.fps) if fps and source.info.fps else 1.0  # --fps resamples it
            frames, keys = keyframe_indices(src)
            if not frames:
                raise StreamStudioError(f"{src} has a video stream but no frames")
        except StreamStudioError as exc:
            failed[src.name] = str(exc)
            continue
        if whole is None:
            pieces = plan_pieces(str(src), str(dst), str(work / "parts" / dst.name), frames, keys,
                                 request.segment_frames, workers, request.max_frames, rate)
        else:
            pieces = plan_pieces(str(src), str(dst), "", frames, [], 0, 1, request.max_frames, rate)
            if request.segment_frames:
                print(f"note: {src.name} is rendered whole: {whole}", file=sys.stderr)
        jobs.append(FileJob(src, dst, pieces))
    return jobs, failed


def run_batch(request: BatchRequest, on_progress: Callable[[dict], None] | None = None) -> int:
    """`render` with --cluster/--workers or several inputs. Returns the exit code (1 when a
    file failed). `on_progress` gets each progress snapshot (worker name -> frames, busy
    seconds, job, pid)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from tqdm import tqdm

    if request.pipeline == "video":
        video.check(request)
    given = request.input
    inputs = batch_inputs(given) or ([Path(given).expanduser()] if given else [])
    if not inputs:
        raise StreamStudioError("--input is required (a video file, a folder or glob of videos, a,b,c or @list.txt)")
    if not request.output:
        raise StreamStudioError("--output is required (a folder, or a video file for one input)")
    outputs, work = output_paths(inputs, request.output)
    joblist = JobList(work, request.fingerprint)
    todo = [(src, dst) for src, dst in zip(inputs, outputs) if not joblist.finished(dst)]
    executor = make_executor(request) if todo else None  # its worker count sets the default cuts
    jobs, failed = plan(request, [s for s, _ in todo], [d for _, d in todo], work, executor.workers if executor else 1)
    skipped = len(inputs) - len(todo)
    pending = []
    for job in jobs:
        job.done = {p.key for p in job.pieces if p.part is not None and part_done(p.part)}
        pending += [p for p in job.pieces if p.key not in job.done]
    by_output = {str(job.output): job for job in jobs}
    size = {str(job.output): sum(p.frames or 0 for p in job.pieces) for job in jobs}
    # longest files first (the last jobs to finish are short), a file's segments in order (its stitch follows them)
    pending.sort(key=lambda p: (-size[p.output], p.index))
    print(f"render: {len(inputs)} input(s), {len(pending)} job(s) ({sum(j.pieces[0].count > 1 for j in jobs)} "
          f"file(s) in segments), {skipped} finished output(s) skipped, on "
          f"{executor.name if executor else 'nothing'}", file=sys.stderr)
    rendered: list[FileJob] = []
    t0, finished_frames = time.perf_counter(), [0]
    board: dict[str, dict] = {}  # worker name -> its progress
    split = [job for job in jobs if job.pieces[0].count > 1]
    # frames to render, then to stitch: the bar reaches its end when the last output is written
    total = sum(p.frames or 0 for p in pending) + sum(size[str(job.output)] for job in split)
    bar = tqdm(total=total or None, unit="frame", desc="render", dynamic_ncols=True, disable=not (pending or split))
    changed = threading.Condition()  # a piece finished or failed, or the run ended
    ended = [False]

    def ready(piece: Piece) -> bool:
        job = by_output[piece.output]
        with changed:
            changed.wait_for(lambda: piece.key in job.done or job.input.name in failed or ended[0])
            return piece.key in job.done

    stitcher = ThreadPoolExecutor(1, thread_name_prefix="streamstudio-stitch")  # follows the rendering
    stitched = [0]  # frames the stitches wrote

    def count_stitched() -> None:
        stitched[0] += 1

    stitches = {job.input.name: (job, stitcher.submit(_stitch, job, work, request, ready, count_stitched))
                for job in split}

    def on_tick(snapshot: dict) -> None:
        board.clear()
        board.update(snapshot)
        done = finished_frames[0] + stitched[0] + sum(w.get("job_frames", 0) for w in snapshot.values()
                                                      if w["job"] is not None)
        bar.update(max(0, done - bar.n))
        bar.set_postfix_str(_worker_fps(snapshot), refresh=False)
        if on_progress is not None:
            on_progress(snapshot)

    def on_result(result: PieceResult) -> None:
        job = by_output[result.key.rsplit("#", 1)[0]]
        with changed:
            if result.error is not None:
                failed[job.input.name] = result.error
            else:
                finished_frames[0] += result.frames
                job.done.add(result.key)
            changed.notify_all()
        if result.error is None and job.pieces[0].count == 1:
            joblist.record(job.output, result.frames)
            rendered.append(job)

    outcome = Outcome()
    try:
        if pending:
            assert executor is not None  # (made when there is work)
            outcome = executor.run(pending, work, on_result, on_tick)
    finally:
        with changed:
            for key, why in outcome.failed.items():
                failed[by_output[key.rsplit("#", 1)[0]].input.name] = why
            ended[0] = True  # stitches still waiting for a part stop
            changed.notify_all()
        while not all(future.done() for _, future in stitches.values()):  # the last stitch, with its progress
            time.sleep(0.25)
            on_tick(board.copy())
        stitcher.shutdown(wait=True)
        bar.close()
        if executor is not None:
            executor.close()
    for name, (job, future) in stitches.items():
        try:
            joblist.record(job.output, future.result())
            rendered.append(job)
        except (StreamStudioError, OSError) as exc:
            failed.setdefault(name, f"stitching its segments: {exc}")
    return _summary(inputs, rendered, skipped, failed, outcome, board, t0)


def _worker_fps(board: dict) -> str:
    return ", ".join(f"{n} {w['frames'] / w['busy']:.1f} fps" for n, w in sorted(board.items()) if w["busy"] > 0)


def _stitch(job: FileJob, work: Path, request: BatchRequest, ready: Callable[[Piece], bool],
            on_frame: Callable[[], None]) -> int:
    target = work / "partial" / job.output.name
    target.parent.mkdir(parents=True, exist_ok=True)
    frames = stitch(job.pieces, target, request, ready, on_frame)
    os.replace(target, job.output)
    remove_parts(job.pieces)
    return frames


def _summary(inputs, rendered, skipped: int, failed, outcome: Outcome, board: dict, t0: float) -> int:
    seconds = time.perf_counter() - t0
    frames = sum(r.frames for r in outcome.results)
    fps = _worker_fps(board)
    stitched = sum(job.pieces[0].count > 1 for job in rendered)
    lost = f"; {outcome.workers_lost} worker(s) lost, their jobs run again" if outcome.workers_lost else ""
    print(f"done: {len(rendered)} of {len(inputs)} file(s) rendered ({stitched} stitched from segments), "
          f"{skipped} skipped as finished, {len(failed)} failed; {frames} frames in {seconds:.1f}s"
          f"{f' ({fps})' if fps else ''}{lost}", file=sys.stderr)
    for name, why in sorted(failed.items()):
        print(f"failed: {name}: {why}", file=sys.stderr)
    for job in rendered:
        print(f"wrote {job.output}")
    return 1 if failed else 0


__all__ = ["JobList", "LocalExecutor", "RayExecutor", "RenderWorker", "add_arguments", "batch_inputs",
           "run_batch", "wants_batch"]
