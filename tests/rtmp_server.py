"""A real nginx with the RTMP module for tests (imported as `rtmp_server`; pytest puts tests/ on
the path): started on 127.0.0.1 at a free port with its own prefix and config, stopped after.
The `nginx` fixture in conftest.py uses it and skips when nginx or the module is missing."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

av = pytest.importorskip("av", reason="PyAV is not installed (the GPU image has none)")

MODULE_PATHS = ("/usr/lib/nginx/modules/ngx_rtmp_module.so", "/usr/lib64/nginx/modules/ngx_rtmp_module.so")

CONFIG = """
load_module {module};
daemon off;
master_process off;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log info;
events {{ worker_connections 64; }}
rtmp {{
    server {{
        listen 127.0.0.1:{port};
        chunk_size 4096;
        application live {{
            live on;
            idle_streams off;
            record all;
            record_path {prefix}/rec;
            record_unique off;
        }}
    }}
}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def find_module() -> str:
    """The RTMP module's path; skips the test when nginx or the module is missing."""
    if shutil.which("nginx") is None:
        pytest.skip("nginx is not installed (apt-get install nginx libnginx-mod-rtmp)")
    module = next((m for m in MODULE_PATHS if Path(m).exists()), None)
    if module is None:
        pytest.skip("the nginx RTMP module is not installed (apt-get install libnginx-mod-rtmp)")
    return module


class Nginx:
    def __init__(self, prefix: Path, module: str):
        self.prefix, self.module, self.port = prefix, module, free_port()
        (prefix / "rec").mkdir(parents=True, exist_ok=True)
        (prefix / "logs").mkdir(exist_ok=True)
        self.conf = prefix / "nginx.conf"
        self.conf.write_text(CONFIG.format(module=module, prefix=prefix, port=self.port))
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([shutil.which("nginx"), "-p", str(self.prefix), "-c", str(self.conf),
                                      "-e", str(self.prefix / "error.log")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if not wait_port(self.port):
            self.stop()
            log = (self.prefix / "error.log").read_text() if (self.prefix / "error.log").exists() else ""
            pytest.skip(f"nginx with the RTMP module did not start: {log[-500:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # an abrupt drop, as a crashed server
            self.proc.wait(10)
        self.proc = None

    def pids(self) -> list[int]:
        """nginx's processes: the one started (the only one with `master_process off`, else
        the master) and its children (workers), found through /proc."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        pids = [self.proc.pid]
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
            if ppid == self.proc.pid:
                pids.append(int(stat.parent.name))
        return pids

    @contextlib.contextmanager
    def frozen(self):
        """nginx stopped with SIGSTOP, as a frozen server: its connections stay open, but
        nothing is read or answered (the kernel still accepts new connections). SIGCONT after,
        whatever happens, so that `stop()` finds it running."""
        pids = self.pids()
        assert pids, "nginx is not running"
        try:
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            yield pids
        finally:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    def url(self, key: str = "test") -> str:
        return f"rtmp://127.0.0.1:{self.port}/live/{key}"

    def publisher_log(self, key: str = "test") -> list[str]:
        """nginx's log lines of the connection that published stream `key`, oldest first."""
        text = (self.prefix / "error.log").read_text()
        found = re.search(r"\*(\d+) publish: name='" + re.escape(key) + "'", text)
        if found is None:
            return []
        tag = f"*{found.group(1)} "
        return [line for line in text.splitlines() if tag in line]

    def recording(self, key: str = "test") -> Path:
        """nginx's recording of stream `key` (complete once the publisher has left)."""
        return self.prefix / "rec" / f"{key}.flv"


def read_stream(url: str, result: dict, timeout: float = 1.5) -> None:
    """Play the stream and count frames until it ends (or no data for `timeout` s); an error
    (a timeout included) is kept in result["end"]."""
    options = {"analyzeduration": "300000", "probesize": "65536", "fflags": "nobuffer"}
    try:
        with av.open(url, timeout=(10.0, timeout), options=options) as c:
            for frame in c.decode(video=0):
                result.setdefault("size", (frame.width, frame.height))
                result["count"] = result.get("count", 0) + 1
    except av.error.FFmpegError as exc:
        result["end"] = str(exc)


def ffprobe(url: str, timeout: float = 20.0, tries: int = 3) -> dict:
    """The first video stream of `url` (a file, an RTMP URL) as ffprobe reads it, with the number of
    frames it decodes (`nb_read_frames`, files only); {} when ffprobe finds none in time. A live RTMP
    stream is asked again (up to `tries` times): a reader that joins it between key frames, on a
    loaded machine, may find no stream the first time (a CI run read {} once from a running push)."""
    import json
    import shutil
    import subprocess

    exe = shutil.which("ffprobe")
    assert exe, "ffprobe is missing (apt-get install ffmpeg)"
    count = [] if url.startswith("rtmp") else ["-count_frames"]
    for _ in range(tries if url.startswith("rtmp") else 1):
        try:
            out = subprocess.run([exe, "-v", "error", *count, "-select_streams", "v:0", "-show_entries",
                                  "stream=codec_name,width,height,nb_read_frames", "-of", "json", url],
                                 capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            continue
        streams = json.loads(out.stdout or "{}").get("streams") or [{}]
        if streams[0]:
            return streams[0]
    return {}
