"""benchmarks/gpu_session.sh runs on the GPU image as it is (issue 12, "the GPU run must run
everything, the first time"), and benchmarks/gpu_summary.py reports every figure and stage.

The GPU image has Python, torch with CUDA, Triton, onnx, onnxruntime and the packages in
GPU_IMAGE below, plus the wheels benchmarks/gpu_wheels.sh carries; it has no PyAV, Gradio or
fastrtc. `gpu_image_env` makes such an environment here: a `sitecustomize` on PYTHONPATH hides
every installed distribution that is not on the image, both from `import` (as if absent: the
import fails with ModuleNotFoundError and `importlib.util.find_spec` says None) and from
`importlib.metadata` (so pytest does not load their plugins). Under it, the script's dry run
must collect every `gpu` test (counted here independently, from the test files' syntax trees)
and import every benchmark script it runs.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_session.sh"
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_summary  # noqa: E402

# The image's Python packages (/work/.library/device/KINDS.md, "Python packages already there",
# read on 2026-11-17). Keep in step with it.
GPU_IMAGE = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split()

BLOCKER = '''\
"""Made by tests/acceleration/test_gpu_session.py: hide what the GPU image does not have."""
import importlib.machinery
import importlib.metadata
import re
import shutil

_norm = lambda s: re.sub(r"[-_.]+", "-", s or "").lower()
_ALLOWED = {_norm(n) for n in %(allowed)r}
_HIDDEN = {_norm(d.metadata["Name"]) for d in importlib.metadata.distributions()} - _ALLOWED
_TOP = importlib.metadata.packages_distributions()
_BLOCKED = {top for top, dists in _TOP.items() if dists and all(_norm(d) in _HIDDEN for d in dists)}
_PF = importlib.machinery.PathFinder
_find_spec, _find_distributions = _PF.find_spec, _PF.find_distributions


def _spec(cls, name, path=None, target=None):
    if name.partition(".")[0] in _BLOCKED:
        return None
    return _find_spec(name, path, target)


def _dists(cls, *args, **kwargs):
    for d in _find_distributions(*args, **kwargs):
        if _norm(d.metadata["Name"]) not in _HIDDEN:
            yield d


_PF.find_spec = classmethod(_spec)
_PF.find_distributions = classmethod(_dists)
'''


def carried_wheels() -> list[str]:
    """The distributions benchmarks/gpu_wheels.sh downloads ("name==version")."""
    return re.findall(r'"([A-Za-z0-9_.-]+)==[0-9]', (ROOT / "benchmarks" / "gpu_wheels.sh").read_text())


@pytest.fixture(scope="module")
def gpu_image_env(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpu_image")
    allowed = sorted(GPU_IMAGE + carried_wheels() + ["streamstudio"])
    (folder / "sitecustomize.py").write_text(BLOCKER % {"allowed": allowed})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))}
    env.pop("PYTEST_ADDOPTS", None)
    return env


def gpu_tests_by_syntax() -> dict[str, set[str]]:
    """{file: {test functions}} of every test carrying the gpu mark: decorated with it (directly
    or through pytest.param marks), in a class that is, or in a module whose pytestmark is."""
    found = {}
    for path in sorted((ROOT / "tests").glob("*/test_*.py")):
        tree = ast.parse(path.read_text())
        marked = lambda node: any("mark.gpu" in ast.unparse(d) for d in node.decorator_list)  # noqa: E731
        module_marked = any(isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in n.targets)
                            and "mark.gpu" in ast.unparse(n.value) for n in tree.body)
        names = set()
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                if module_marked or marked(node):
                    names.add(node.name)
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("test"):
                        if module_marked or marked(node) or marked(item):
                            names.add(f"{node.name}::{item.name}")
        if names:
            found[path.relative_to(ROOT).as_posix()] = names
    return found


def test_the_gpu_tests_are_found_by_the_scripts_selection():
    """The script runs the files `grep -l 'mark\\.gpu'` names; every file with a gpu test is one."""
    by_syntax = gpu_tests_by_syntax()
    assert {"tests/acceleration/test_kernels_ops.py", "tests/splats/test_splat_cuda.py"} <= set(by_syntax)
    grepped = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").glob("*/test_*.py")
               if re.search(r"mark\.gpu", p.read_text())}
    assert set(by_syntax) <= grepped


def test_dry_run_on_the_gpu_image_collects_every_gpu_test_and_imports_every_benchmark(gpu_image_env, tmp_path):
    # In the default run (about 35 s): the proof that the GPU session runs, the first time.
    env = gpu_image_env
    for name in ("av", "gradio", "fastrtc"):  # the environment is the image's
        probe = subprocess.run([sys.executable, "-c", f"import importlib.util as u; import {name}"], env=env,
                               capture_output=True, text=True)
        assert probe.returncode != 0 and "ModuleNotFoundError" in probe.stderr, (name, probe.stderr[-500:])
    out = tmp_path / "out"
    run = subprocess.run(["bash", str(SCRIPT), "first", "second", "later", "--dry-run"], cwd=ROOT,
                         capture_output=True, text=True, env={**env, "OUT": str(out)}, timeout=600)
    log = (out / "session.log").read_text() if (out / "session.log").is_file() else ""
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    stages = {s["stage"]: s for s in json.loads((out / "stages.json").read_text())["stages"]}
    assert stages["webapp"]["status"] == "missing" and "gradio" in stages["webapp"]["error"]
    assert stages["tensorrt"]["status"] == "missing" and "no TensorRT" in stages["tensorrt"]["error"]
    for name in ("build", "tests", "frame_path", "peers", "kernels", "stream_diffusion", "splats", "video",
                 "multistream", "tests_slow", "addons", "kernels_full"):
        assert stages[name]["status"] == "dry-run", (name, stages[name], log[-3000:])

    # every gpu test, and no error: collected node ids against the test files' syntax trees
    collected: dict[str, set[str]] = {}
    for line in log.splitlines():
        m = re.match(r"^(tests/\w+/test_\w+\.py)::(\S+?)(\[.*\])?$", line.strip())
        if m:
            collected.setdefault(m.group(1), set()).add(m.group(2))
    expected = gpu_tests_by_syntax()
    for file, names in expected.items():
        assert names <= collected.get(file, set()), (file, names - collected.get(file, set()))
    n_collected = sum(1 for ln in log.splitlines() if re.match(r"^tests/\w+/test_\w+\.py::", ln.strip()))
    assert n_collected >= sum(len(v) for v in expected.values())
    # the tests stage and tests_slow split the gpu tests between them (slow: the second call's)
    counts = [re.search(r"(\d+)/\d+ tests collected", stages[name]["last_line"]) for name in ("tests", "tests_slow")]
    last = [stages[name]["last_line"] for name in ("tests", "tests_slow")]
    assert all(counts) and sum(int(m.group(1)) for m in counts) == n_collected, last
    assert all("error" not in stages[name]["last_line"] for name in ("tests", "tests_slow"))
    assert "MISSING | stage webapp missing: not run: gradio" in (out / "summary.md").read_text()


@pytest.mark.slow
def test_a_stage_is_not_started_when_the_calls_time_is_spent(tmp_path):
    out = tmp_path / "out"
    run = subprocess.run(["bash", str(SCRIPT), "tests", "--dry-run"], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "OUT": str(out), "GPU_SESSION_BUDGET": "20"}, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:]
    (stage,) = json.loads((out / "stages.json").read_text())["stages"]
    assert stage["stage"] == "tests" and stage["status"] == "missing" and "not started" in stage["error"]


def test_unknown_stage_is_refused():
    run = subprocess.run(["bash", str(SCRIPT), "chek"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "unknown stage or group: chek" in run.stderr


# ------------------------------------------------------------------------------ the summary
GPU = "NVIDIA H100 80GB HBM3"


def write_results(folder: Path, eager=85.0, compile_fps=160.0, floor=(82.0, 55.0)) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kernels.json").write_text(json.dumps({
        "device": GPU, "copy_bandwidth_GBps": 3000.0,
        "ops": [{"op": "preprocess 1080p", "floor_pct": floor[0]}, {"op": "postprocess 1080p", "floor_pct": floor[1]}],
        "pipeline": [{"mode": "eager", "model": "sd-turbo arch", "fps": eager},
                     {"mode": "fused kernels", "model": "sd-turbo arch", "fps": eager * 1.1},
                     {"mode": "fused + torch.compile", "model": "sd-turbo arch", "fps": compile_fps}],
        "notes": []}))
    (folder / "gpu_tests.xml").write_text(
        '<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="105" failures="1" errors="0" '
        'skipped="2"></testsuite></testsuites>')


def write_figures(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"mode": m, "streams": k, "total_fps": fps} for m, k, fps in
            (("turns", 1, 80.0), ("batched", 1, 80.0), ("turns", 4, 82.0), ("batched", 4, 200.0))]
    (folder / "multistream.json").write_text(json.dumps({"device": GPU, "model": "sd-turbo arch", "rows": rows,
                                                         "batched_over_turns": {"1": 1.0, "4": 2.44}}))
    (folder / "stream_diffusion.json").write_text(json.dumps({
        "device": GPU, "stream_batch_speedup": 1.5, "rcfg_self_speedup": 1.9, "overhead_ratio": 1.2,
        "speedups_measured_on": "sd_turbo_arch", "sd_turbo_arch": {"fps_1step_512": 90.0}}))
    (folder / "splats.json").write_text(json.dumps({"benchmark": "splats", "cuda": {
        "status": "missing: the CUDA kernel did not build"}}))
    (folder / "stream_video.json").write_text(json.dumps({"gpu_4b": {"step_ms": 510.0, "device": GPU}}))


def figure(text: str, label: str) -> list[str]:
    line = next(ln for ln in text.splitlines() if ln.startswith(f"| {label} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_summary_puts_every_figure_against_its_target(tmp_path):
    write_results(tmp_path / "a")
    write_figures(tmp_path / "b")
    gpu_summary.record(tmp_path / "b", "webapp", missing="not run: gradio fastrtc aiortc av not installed")
    text = gpu_summary.table([tmp_path / "a", tmp_path / "b"])
    assert GPU in text.splitlines()[0]
    assert figure(text, "img2img eager (fps)")[1:4] == ["85.0", ">= 70", "pass"]
    assert figure(text, "img2img --acceleration compile (fps)")[1:4] == ["160.0", ">= 150", "pass"]
    trt = figure(text, "img2img TensorRT (fps)")
    assert trt[1] == "missing" and "TensorRT not installed" in trt[4]
    assert figure(text, "fused preprocess 1080p (% of bandwidth floor)")[3] == "pass"
    assert figure(text, "fused postprocess 1080p (% of bandwidth floor)")[3] == "FAIL"
    assert figure(text, "4 streams batched / 1 stream (total fps)")[1:4] == ["2.5", ">= 2.0x", "pass"]
    assert figure(text, "pipeline overhead ratio")[3] == "FAIL"
    assert figure(text, "Stream Batch speedup")[3] == "pass"
    web = figure(text, "camera-to-screen latency, web app, 1 client (ms)")
    assert web[3] == "MISSING" and "gradio fastrtc aiortc av not installed" in web[4]
    splat = figure(text, "splats 1M Gaussians 1920x1080 CUDA (fps)")
    assert splat[1] == "missing" and "did not build" in splat[4]
    assert figure(text, "StreamDiT 4B step (ms)")[1] == "510.0"
    tests = figure(text, "gpu tests")
    assert tests[1] == "102 passed, 1 failed, 0 errors, 2 skipped" and tests[3] == "FAIL"
    assert "| webapp | missing |" in text and "no stage failed" in text


def test_summary_of_a_killed_and_a_failed_stage(tmp_path):
    out = tmp_path / "out"
    write_figures(out)
    (out / "stream_diffusion.json").unlink()
    killed = tmp_path / "kernels.log"
    killed.write_text("copy bandwidth: 2950.1 GB/s\ncompiling the UNet...\n")
    gpu_summary.record(out, "kernels", rc=124, seconds=220, limit=220, log=killed)
    failed = tmp_path / "sd.log"
    failed.write_text(textwrap.dedent("""\
        loading
        Traceback (most recent call last):
          File "benchmarks/stream_diffusion.py", line 1, in <module>
        RuntimeError: CUDA error: out of memory
        During handling of the above exception, another exception occurred:
        ValueError: later
        """))
    gpu_summary.record(out, "stream_diffusion", rc=1, seconds=12, limit=150, log=failed)
    tests_log = tmp_path / "tests.log"
    tests_log.write_text("collected 105 items\n\ntests/acceleration/test_kernels_ops.py::test_gpu_a[x] PASSED [  1%]\n"
                         "tests/acceleration/test_kernels_ops.py::test_gpu_b FAILED [  2%]\n"
                         "tests/splats/test_splat_cuda.py::test_c SKIPPED (needs TensorRT) [  3%]\n")
    gpu_summary.record(out, "tests", rc=137, seconds=190, limit=180, log=tests_log)
    text = gpu_summary.table([out])
    eager = figure(text, "img2img eager (fps)")
    assert eager[3] == "MISSING" and "stage kernels killed: killed at its time limit (220 s)" in eager[4]
    assert "compiling the UNet" in eager[4]
    assert "RuntimeError: CUDA error: out of memory" in figure(text, "Stream Batch speedup")[4]
    assert "| stream_diffusion | failed | 12 / 150 | RuntimeError: CUDA error: out of memory |" in text
    tests = figure(text, "gpu tests")
    assert tests[1] == "1 passed, 1 failed, 0 errors, 1 skipped" and tests[3] == "FAIL" and "partial" in tests[4]
    assert "stages failed or killed: kernels, stream_diffusion, tests" in text
    assert figure(text, "4 streams batched / 1 stream (total fps)")[3] == "pass"  # other stages still count
    assert gpu_summary.main(["table", str(out), "--quiet", "--strict", "--write", str(out / "summary.md")]) == 1
    assert (out / "summary.md").read_text().strip() == text


def test_a_later_folders_stage_replaces_an_earlier_one(tmp_path):
    write_results(tmp_path / "a", eager=50.0)
    gpu_summary.record(tmp_path / "a", "kernels", rc=0, seconds=100, limit=220)
    gpu_summary.record(tmp_path / "b", "kernels", rc=1, seconds=5, limit=220, log=None)
    text = gpu_summary.table([tmp_path / "a", tmp_path / "b"])
    assert figure(text, "img2img eager (fps)")[3] == "MISSING"  # the rerun failed: not the old figure
    assert figure(text, "gpu tests")[3] == "FAIL"  # the tests' XML of folder a still counts
    assert gpu_summary.table([tmp_path / "b", tmp_path / "a"]).count("| 50.0 | >= 70 | FAIL |") == 1


def test_first_error_line():
    assert gpu_summary.first_error_line("ok\nFAILED tests/t.py::x - AssertionError\nE boom\n") == \
        "FAILED tests/t.py::x - AssertionError"
    assert gpu_summary.first_error_line("a\nstream_ops.cu(12): error: expected a ;\nb\n").endswith("expected a ;")
    assert gpu_summary.first_error_line("just\nthe end\n") == "the end"
    assert gpu_summary.first_error_line("") is None


# ---------------------------------------------------------------------------- the device budget
# The GPU image (/work/.library/device/KINDS.md, read 2026-11-17): Python 3.12.3, torch
# 2.11.0+cu130 (CUDA 13.0), one H100 or H200 (compute capability 9.0). A lent machine comes with
# 15 minutes of device time, every start (1-2 min) and idle wait counted (issue 26).
GPU_IMAGE_PYTHON = (3, 12)
GPU_IMAGE_TORCH = "2.11.0+cu130"
GPU_IMAGE_CUDA = "13.0"
GPU_ARCH = "sm_90"
FIRST_CALL_S, SECOND_CALL_S = 9 * 60, 240
DEVICE_S, START_S = 15 * 60, 60  # a task's device time; a machine's start (30-60 s seen on 2026-11-26)


def plan(*groups: str) -> dict:
    run = subprocess.run(["bash", str(SCRIPT), "--plan", *groups], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_the_first_call_makes_every_headline_figure_within_nine_minutes():
    """Call 1 fits 9 minutes (the machine's start excluded) and makes every headline figure of
    issue 45; call 2 fits 4. Every stage's limit fits its call's budget together with the others' (so no stage is
    cut for time), and the budget leaves the call a margin."""
    groups = plan("first")["groups"]
    assert groups["first"]["call_timeout_s"] <= FIRST_CALL_S and groups["second"]["call_timeout_s"] <= SECOND_CALL_S
    # both calls fit the task's device time even when the second must start a machine again
    assert FIRST_CALL_S + SECOND_CALL_S + 2 * START_S <= DEVICE_S
    for name in ("first", "second"):
        p = plan(name)
        assert sum(s["limit"] for s in p["stages"]) + p["reserve"] <= p["budget"] < groups[name]["call_timeout_s"]
        assert all(s["limit"] > 0 for s in p["stages"] if s["stage"] not in ("tensorrt", "webapp")), p
    first = [s["stage"] for s in plan("first")["stages"]]
    assert first[0] == "build"  # the extensions before anything uses them
    headline = {gpu_summary.STAGE_OF[file] for _, file, *_ in gpu_summary.FIGURES} | {"tests"}
    second = [s["stage"] for s in plan("second")["stages"]]
    later = [s["stage"] for s in plan("later")["stages"]]
    assert headline <= set(first) | set(second) | set(later), headline - set(first + second + later)
    assert {"frame_path", "peers", "multistream", "tests", "tensorrt"} <= set(first)
    assert {"splats", "video", "addons"} <= set(second) and not set(later) & set(first + second)


def test_the_prebuilt_extensions_target_the_gpu_image():
    """benchmarks/gpu_prebuild.sh builds for the image's Python, torch and GPU, and the session
    carries what it makes."""
    text = (ROOT / "benchmarks" / "gpu_prebuild.sh").read_text()
    assert f"TARGET_PYTHON={GPU_IMAGE_PYTHON[0]}.{GPU_IMAGE_PYTHON[1]}" in text
    assert (f"TARGET_TORCH_VERSION={GPU_IMAGE_TORCH} " in text
            and f"TARGET_TORCH={GPU_IMAGE_TORCH.split('+')[0]}" in text)
    assert f"TARGET_ARCH={GPU_ARCH[3]}.{GPU_ARCH[4]}" in text
    session = SCRIPT.read_text()
    assert 'carry=[".whl", ".gpu_ext"]' in session and "STREAMSTUDIO_PREBUILT_KERNELS=$PWD/.gpu_ext" in session


def test_carried_extensions_are_the_ones_the_gpu_image_looks_for():
    """.gpu_ext (made by gpu_prebuild.sh, ignored by git): built for Python 3.12, torch
    2.11.0+cu130 and sm_90, under the build keys the image's process computes from today's sources
    (a stale folder would be passed over there and the extensions built: run gpu_prebuild.sh again)."""
    from streamstudio.kernels import EXTENSION, SOURCES, cuda_build, splat_cuda

    manifest = ROOT / ".gpu_ext" / "manifest.json"
    if not manifest.is_file():
        pytest.skip("no .gpu_ext here (bash benchmarks/gpu_prebuild.sh makes it before a GPU session)")
    m = json.loads(manifest.read_text())
    assert (m["python"], m["torch"], m["cuda"], m["arch"]) == ("%d.%d" % GPU_IMAGE_PYTHON, GPU_IMAGE_TORCH,
                                                               GPU_IMAGE_CUDA, GPU_ARCH)
    target = (GPU_IMAGE_TORCH, GPU_IMAGE_CUDA, GPU_IMAGE_PYTHON)
    for name, sources in ((EXTENSION, SOURCES), (splat_cuda.EXTENSION, splat_cuda.SOURCES)):
        key = cuda_build.extension_key(name, sources, target=target)
        expected = cuda_build.prebuilt_file(name, key.rsplit("_", 1)[1], GPU_ARCH)
        assert m["files"][name] == expected, f"{name}: stale prebuilt extension; run benchmarks/gpu_prebuild.sh"
        data = (ROOT / ".gpu_ext" / expected).read_bytes()
        assert data[:4] == b"\x7fELF" and f"PyInit_{key}".encode() in data


def test_a_prebuilt_extension_is_taken_for_its_key_and_gpu_only(tmp_path, monkeypatch, caplog):
    """The loader imports the prebuilt file named for the build key and this GPU's architecture
    (faked: no GPU here), and builds instead when there is none or it does not load."""
    import types

    import torch

    from streamstudio.kernels import SOURCES, cuda_build

    monkeypatch.setenv(cuda_build.PREBUILT_ENV, str(tmp_path))
    capability = [(9, 0)]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability[0])
    imported = []

    def fake_import(module_name, path):
        imported.append((module_name, path.name))
        if path.read_bytes() == b"broken":
            raise ImportError("undefined symbol: _ZN3c10")
        return types.ModuleType(module_name)

    monkeypatch.setattr(cuda_build, "_import_file", fake_import)
    (tmp_path / "stream_ops_abc.sm_90.so").write_bytes(b"")
    assert cuda_build._prebuilt("stream_ops", "abc").__name__ == "stream_ops_abc"
    assert cuda_build._prebuilt("stream_ops", "other") is None  # another build key: built
    capability[0] = (8, 0)
    assert cuda_build._prebuilt("stream_ops", "abc") is None  # another GPU: built
    capability[0] = (9, 0)
    (tmp_path / "stream_ops_abc.sm_90.so").write_bytes(b"broken")
    assert cuda_build._prebuilt("stream_ops", "abc") is None and "does not load" in caplog.text
    assert imported == [("stream_ops_abc", "stream_ops_abc.sm_90.so")] * 2

    # _build takes it before building anything (a CUDA extension only)
    paths = cuda_build._resolve(SOURCES)
    digest = cuda_build._digest(paths, cuda_build.Flags())
    (tmp_path / cuda_build.prebuilt_file("stream_ops", digest, "sm_90")).write_bytes(b"")
    module = cuda_build._build("stream_ops", paths, cuda_build.Flags(), verbose=False)
    assert module.__name__ == f"stream_ops_{digest}"


# ---------------------------------------------------------------------------- the web app's wheels
def fake_wheel(folder: Path, name: str) -> Path:
    """A minimal wheel of a package `name` whose module says its name."""
    import zipfile

    path = folder / f"{name}-0.1-py3-none-any.whl"
    info = f"{name}-0.1.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}/__init__.py", f"NAME = {name!r}\n")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


def test_the_web_apps_wheels_travel_in_parts_and_install_once_all_are_staged(tmp_path):
    """Issue 45, item 6: the wheels are over what one call carries, so they go as parts, one a call,
    kept on the held machine; the last part puts the tar together, checks it and installs it."""
    import hashlib
    import tarfile

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name in ("fakegradio", "fakeav"):
        fake_wheel(wheels, name)
    tar = tmp_path / "wheels.tar"
    with tarfile.open(tar, "w") as t:
        for w in wheels.iterdir():
            t.add(w, arcname=w.name)
    data = tar.read_bytes()
    half = len(data) // 2
    parts = tmp_path / "parts"
    for n, chunk in ((1, data[:half]), (2, data[half:])):
        (parts / str(n)).mkdir(parents=True)
        (parts / str(n) / "part").write_bytes(chunk)
        (parts / str(n) / "manifest.json").write_text(json.dumps(
            {"part": n, "parts": 2, "sha256": hashlib.sha256(data).hexdigest()}))
    stage = tmp_path / "stage"
    env = {**os.environ, "WEBAPP_PARTS_DIR": str(parts), "WEBAPP_STAGE_DIR": str(stage)}
    script = ROOT / "benchmarks" / "gpu_webapp_stage.sh"
    first = subprocess.run(["bash", str(script), "1"], env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0 and "1 of 2" in first.stdout and not (stage / "ready").exists(), first.stderr
    second = subprocess.run(["bash", str(script), "2"], env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0 and (stage / "ready").exists(), second.stdout + second.stderr
    probe = subprocess.run([sys.executable, "-c", "import fakegradio, fakeav; print(fakegradio.NAME, fakeav.NAME)"],
                           env={**os.environ, "PYTHONPATH": str(stage / "site")}, capture_output=True, text=True)
    assert probe.stdout.split() == ["fakegradio", "fakeav"], probe.stderr
    # a part that does not belong: refused by its checksum, nothing installed
    (parts / "2" / "part").write_bytes(data[half:] + b"x")
    shutil.rmtree(stage)
    subprocess.run(["bash", str(script), "1"], env=env, capture_output=True, text=True, timeout=120)
    bad = subprocess.run(["bash", str(script), "2"], env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "sha256" in bad.stderr and not (stage / "ready").exists()
    missing = subprocess.run(["bash", str(script), "3"], env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "carry .webwhl/3" in missing.stderr


def test_a_variant_whose_warm_up_fails_leaves_the_others_measured():
    """The H200 draw of 2026-11-28 lost every tuned figure to the FP8 variant's compile error:
    frame_path's interleaved windows leave such a variant out and say why."""
    import frame_path

    class Mode:
        def __init__(self, name, broken=False):
            self.name, self.broken, self.calls = name, broken, 0

        def run(self, images):
            if self.broken:
                raise RuntimeError("self must be row_major, got stride (1, 4096)\nmore")
            self.calls += 1
            return len(images)

    good, bad, other = Mode("a"), Mode("b", broken=True), Mode("c")
    failed: dict = {}
    fps = frame_path.interleaved([good, bad, other], list(range(20)), rounds=3, sync=lambda: None, failed=failed)
    assert set(fps) == {"a", "c"} and all(v > 0 for v in fps.values())
    assert failed == {"b": "RuntimeError: self must be row_major, got stride (1, 4096)"}
    assert good.calls == other.calls == 4  # the warm-up and three windows
    with pytest.raises(RuntimeError):  # without a place to record it, an error is an error
        frame_path.interleaved([bad], [0], rounds=1, sync=lambda: None)
