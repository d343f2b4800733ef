"""Fuzzing `streamstudio render` with damaged videos (issue 11): 200 byte-mutated copies of two
small clips (mp4 and mkv, H.264 with AAC audio) go through `render --model tiny`. Every run
must end (no hang), without a traceback, with exit code 0 or 1 (1 with exactly one `error:`
line), and every output of a run that exits 0 must decode with PyAV.

Each run is a forked child of the test process (modules and the tiny model already loaded, so
a run costs a fraction of a second), killed when it passes its time limit."""

from __future__ import annotations

import logging
import os
import random
import signal
import sys
import time
import traceback
from pathlib import Path

import pytest
from clips import make_clip

av = pytest.importorskip("av", reason="PyAV is not installed (the GPU image has none)")

SEED = int(os.environ.get("STREAMSTUDIO_FUZZ_SEED", "20240611"))
MUTATIONS = int(os.environ.get("STREAMSTUDIO_FUZZ_RUNS", "200"))
TIMEOUT_S = 60.0
KINDS = ("flip", "truncate", "header", "zero", "splice")


def mutate(data: bytes, kind: str, rng: random.Random, header: tuple[int, int]) -> bytes:
    """One damaged copy of `data`: payload bit flips, a truncation, damage in the container's
    header boxes (`header` = (start, end) of the region holding them), a zeroed block, or a
    chunk deleted or duplicated."""
    b = bytearray(data)
    n = len(b)
    if kind == "flip":
        for _ in range(rng.randint(1, 24)):
            b[rng.randrange(n)] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        del b[rng.randint(0, n - 1):]
    elif kind == "header":
        lo, hi = header
        for _ in range(rng.randint(1, 6)):
            at = rng.randrange(lo, hi)
            size = rng.randint(1, 4)
            b[at:at + size] = bytes(rng.randrange(256) for _ in range(size))[: max(0, n - at)]
    elif kind == "zero":
        at, size = rng.randrange(n), rng.randint(16, 1024)
        b[at:at + size] = bytes(min(size, n - at))
    else:
        at, size = rng.randrange(n), rng.randint(1, 2048)
        chunk = bytes(b[at:at + size])
        if rng.random() < 0.5:
            del b[at:at + size]
        else:
            to = rng.randrange(n)
            b[to:to] = chunk
    return bytes(b)


def header_region(path: Path) -> tuple[int, int]:
    """Where a damaged byte hits the container's structure: mp4's moov box (written last by
    PyAV) or the first KiB of a Matroska file (EBML header, segment info, tracks)."""
    data = path.read_bytes()
    at = data.find(b"moov")
    if path.suffix == ".mp4" and at > 4:
        return at - 4, len(data)
    return 0, min(len(data), 1024)


def run_forked(argv: list[str], log: Path, timeout: float) -> tuple[int | None, float]:
    """(exit code or None when killed for running past `timeout`, seconds) of the CLI in a fork."""
    from streamstudio.app.cli import main

    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: the CLI with stdout, stderr and logging into `log`
        rc = 99
        try:
            fd = os.open(str(log), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            sys.stdout = sys.stderr = open(fd, "w", buffering=1, closefd=False)
            logging.root.handlers.clear()  # cli.main's basicConfig then logs to the file too
            rc = int(main(argv) or 0)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 98
        except BaseException:  # a traceback is what this test looks for
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
            finally:
                os._exit(rc)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status), time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None, time.monotonic() - t0
        time.sleep(0.02)


def playable(path: Path) -> str | None:
    """None when `path` decodes with PyAV (at least one video frame), else why not."""
    try:
        with av.open(str(path)) as c:
            if not c.streams.video:
                return "no video stream"
            frames = sum(1 for _ in c.decode(video=0))
        return None if frames else "no frames"
    except (av.error.FFmpegError, OSError) as exc:
        return f"does not decode: {exc}"


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="runs each render in a forked child")
def test_damaged_videos_never_crash_or_hang(tmp_path, monkeypatch):
    import tqdm

    from streamstudio.app.cli import main

    monkeypatch.setattr(tqdm.tqdm, "monitor_interval", 0)  # no monitor thread to fork with
    clips = [make_clip(tmp_path / "clip.mp4", n=8, fps=8, w=48, h=32, audio=True),
             make_clip(tmp_path / "clip.mkv", n=8, fps=8, w=48, h=32, audio=True)]
    common = ["--model", "tiny", "--device", "cpu", "--steps", "1", "--max-frames", "8", "--mode", "offline"]
    # the undamaged clips render (and load the model and imports once, before the forks)
    for clip in clips:
        assert main(["render", "--input", str(clip), "--output", str(tmp_path / "ok.mp4"), *common]) == 0
        assert playable(tmp_path / "ok.mp4") is None

    rng = random.Random(SEED)
    problems, outcomes, slowest = [], {0: 0, 1: 0}, 0.0
    for i in range(MUTATIONS):
        clip, kind = clips[i % len(clips)], KINDS[(i // len(clips)) % len(KINDS)]
        bad = tmp_path / f"m{i:03d}_{kind}{clip.suffix}"
        bad.write_bytes(mutate(clip.read_bytes(), kind, rng, header_region(clip)))
        out, log = tmp_path / f"m{i:03d}_out.mp4", tmp_path / f"m{i:03d}.log"
        rc, took = run_forked(["render", "--input", str(bad), "--output", str(out), *common], log, TIMEOUT_S)
        slowest = max(slowest, took)
        text = log.read_text(errors="replace") if log.exists() else ""
        errors = [line for line in text.splitlines() if line.startswith("error:")]
        why = None
        if rc is None:
            why = f"hang (killed after {TIMEOUT_S:g} s)"
        elif "Traceback" in text:
            why = "traceback"
        elif rc not in (0, 1):
            why = f"exit code {rc}"
        elif rc == 1 and len(errors) != 1:
            why = f"{len(errors)} error lines"
        elif rc == 0:
            why = playable(out)
        if rc in outcomes:
            outcomes[rc] += 1
        if why:
            problems.append(f"{bad.name}: {why}\n{text[-1500:]}")
        else:  # keep the folder small: only the failures' files stay
            for f in (bad, out, log):
                f.unlink(missing_ok=True)
    print(f"{MUTATIONS} damaged clips: {outcomes[0]} rendered, {outcomes[1]} refused with one error line, "
          f"{len(problems)} problems; slowest run {slowest:.1f} s")
    assert not problems, f"{len(problems)} of {MUTATIONS} runs failed:\n\n" + "\n\n".join(problems[:10])
