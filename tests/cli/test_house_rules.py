"""The house's size rules (issue 46, ../shared/ARCHITECTURE.md): no file in streamstudio/ over
700 lines and no class over 20 methods (its own defs, properties included), so a module keeps one
job and a class one concern; a file or class that grows past them is split by concern."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "streamstudio"
MAX_LINES, MAX_METHODS = 700, 20


def method_counts(tree: ast.AST) -> dict[str, int]:
    return {node.name: sum(isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) for m in node.body)
            for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}


def test_the_counter_counts_methods_and_properties():
    tree = ast.parse("class A:\n    x = 1\n    def a(self): pass\n    @property\n    def b(self): return 1\n"
                     "    async def c(self): pass\n    class Inner:\n        def d(self): pass\n")
    assert method_counts(tree) == {"A": 3, "Inner": 1}


def test_no_file_over_700_lines_and_no_class_over_20_methods():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 50, "the scan found too few files (the path is stale)"
    long = {str(p.relative_to(PACKAGE)): n for p in files if (n := len(p.read_text().splitlines())) > MAX_LINES}
    big = {f"{p.relative_to(PACKAGE)}:{name}": n for p in files
           for name, n in method_counts(ast.parse(p.read_text())).items() if n > MAX_METHODS}
    assert not long, f"files over {MAX_LINES} lines: {long}"
    assert not big, f"classes over {MAX_METHODS} methods: {big}"


# Imports inside functions (issue 46): at most half of the 427 the house had, and each either of a
# module listed here (heavy, optional or absent where the package is imported without it), or of
# the package's own modules and the standard library by a module the CLI loads to answer --help
# and its checks (START_UP below: what the command modules import at their tops), or under an
# ImportError guard. Everything else imports at the top of its module.
MAX_FUNCTION_IMPORTS = 213
DEFERRED = {
    # seconds to import: the CLI answers --help and argument errors without them (test_cli_startup.py)
    "torch": "heavy", "diffusers": "heavy", "transformers": "heavy", "huggingface_hub": "heavy", "peft": "heavy",
    "accelerate": "heavy", "safetensors": "heavy", "cv2": "heavy", "PIL": "heavy", "numpy": "heavy",
    "tqdm": "heavy (for the start-up modules)", "skimage": "heavy",
    # the web stack: the GPU image's benchmarks import the sessions without it (test_gpu_session.py)
    "gradio": "web", "fastrtc": "web", "aiortc": "web", "aioice": "web", "av": "web", "fastapi": "web",
    "starlette": "web", "uvicorn": "web", "python_multipart": "web", "multipart": "web", "pythonosc": "web",
    # optional extras (pyproject.toml) and their modules
    "ray": "extra", "onnx": "extra", "onnxruntime": "extra", "onnxscript": "extra", "tensorrt": "extra",
    "pyvirtualcam": "extra", "mss": "extra", "NDIlib": "extra", "mido": "extra", "zstandard": "extra",
}
# the package's own imports inside functions outside START_UP: each closes what would be a circle
CIRCLES = {("app/web/ray_replicas.py", "streamstudio.app.web.ray_rollout"): "ray_rollout imports ray_replicas"}


def function_imports() -> list[tuple[str, int, str, bool]]:
    """(file, line, module, under an ImportError guard) of every import inside a function."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            above, up = [], parents.get(node)
            while up is not None:
                above.append(up)
                up = parents.get(up)
            if any(isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef)) for a in above):
                module = "streamstudio" if isinstance(node, ast.ImportFrom) and node.level else (
                    node.module if isinstance(node, ast.ImportFrom) else node.names[0].name)
                found.append((str(path.relative_to(PACKAGE)), node.lineno, module or "",
                              any(isinstance(a, ast.Try) for a in above)))
    return found


def start_up_modules() -> set[str]:
    """The package's modules the CLI loads before a command runs: app/cli's package and command
    modules (not the *_run runners) and what they import at their tops, transitively."""
    def top_imports(name: str) -> set[str]:
        path = PACKAGE.parent / (name.replace(".", "/") + ".py")
        path = path if path.exists() else PACKAGE.parent / name.replace(".", "/") / "__init__.py"
        out = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("streamstudio"):
                out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                out |= {a.name for a in node.names if a.name.startswith("streamstudio")}
        return {m for m in out if (PACKAGE.parent / (m.replace(".", "/") + ".py")).exists()
                or (PACKAGE.parent / m.replace(".", "/") / "__init__.py").exists()}

    todo = ["streamstudio.app.cli"] + [f"streamstudio.app.cli.{p.stem}" for p in (PACKAGE / "app" / "cli").glob("*.py")
                                       if not p.stem.endswith("_run") and p.stem != "__init__"]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            parts = name.split(".")
            todo += [".".join(parts[:i]) for i in range(2, len(parts))]  # its packages' __init__ run first
            todo += sorted(top_imports(name) - seen)
    return seen


def test_imports_inside_functions_are_few_and_each_has_its_reason():
    import sys

    found = function_imports()
    assert len(found) > 50, "the scan found too few imports (the path is stale)"
    start_up = {f"streamstudio.{m}" for m in (  # (the scan itself is checked: these must be in it)
        "app.cli.render", "app.streams.image", "streaming.sources")}
    assert start_up <= start_up_modules(), start_up - start_up_modules()
    start_up = start_up_modules()

    def reason(file: str, module: str, guarded: bool) -> str | None:
        top = module.split(".")[0]
        owner = "streamstudio." + file.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        if guarded:
            return "an ImportError guard"
        if top in DEFERRED:
            return DEFERRED[top]
        if (top == "streamstudio" or top in sys.stdlib_module_names) and owner in start_up:
            return "the CLI's start-up"
        return CIRCLES.get((file, module))

    unlisted = [f"{file}:{line} {module}" for file, line, module, guarded in found
                if reason(file, module, guarded) is None]
    assert not unlisted, f"imports inside functions with no reason (import at the module's top): {unlisted}"
    assert len(found) <= MAX_FUNCTION_IMPORTS, f"{len(found)} imports inside functions (at most {MAX_FUNCTION_IMPORTS})"
