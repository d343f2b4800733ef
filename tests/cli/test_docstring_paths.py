"""Every file path a docstring or a comment in streamstudio/ names exists (issue 46: 5 of 88 had
gone stale as modules moved). Docstrings (module, class, function) are read with ast, comments
with tokenize; a path is a word with a slash that names a file (`app/web/whip.py`,
`docs/security.md`, `tests/web/test_osc.py`), a module and what it holds
(`models/image/lora.LoraSet`, `app/streams/video.build_stream`) or a folder (`app/streams/`),
starting at a folder name of this repository. It may be written from streamstudio/, from the
repository's root or from the module's own folder. Other projects' files
(`gsplat/cuda/_torch_impl.py`), URLs, hub ids (`madebyollin/taesd`), HTTP routes
(`/studio/streams`), placeholders (`DIR/jobs.json`), example data files (`out/frame.png`) and
patterns (`frames/%05d.png`, `tests/*/test_*.py`) are not checked."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "streamstudio"

# the repository's own kinds of file; a picture or a checkpoint in a docstring is an example
EXTENSIONS = ("py", "md", "toml", "yaml", "yml", "json", "cfg", "txt", "tsv", "csv", "sh", "cpp", "cu", "h",
              "html", "js", "css", "ply")
DATA = {"safetensors", "bin", "pt", "pth", "ckpt", "onnx", "engine", "plan", "png", "jpg", "jpeg", "webp", "gif",
        "mp4", "mkv", "mov", "webm", "avi", "wav", "npz", "npy", "splat", "spz", "sog", "ssproj", "gguf", "zip"}
_SEGMENT = r"[A-Za-z_][\w-]*"
# a path: segments joined by slashes (at least one), then a file's extension, a module's attribute
# or a closing slash; not inside a URL, an absolute path, a route or a longer word
PATH = re.compile(
    rf"(?<![\w./~:%*{{$-])(?P<path>(?:{_SEGMENT}/)+{_SEGMENT})"
    rf"(?:\.(?P<ext>{'|'.join(EXTENSIONS)})\b(?![\w/-])|(?P<attr>\.[A-Za-z_]\w*)|(?P<slash>/)(?![\w*%{{]))")


@cache
def folder_names() -> frozenset[str]:
    """The name of every folder of the repository (a path starting elsewhere is another project's)."""
    skip = {".git", "__pycache__", "node_modules", ".venv", ".pytest_cache", ".ruff_cache", ".mypy_cache"}
    names = set()
    for folder in [REPO, *REPO.rglob("*")]:
        if folder.is_dir() and not skip.intersection(folder.relative_to(REPO).parts):
            names.add(folder.name)
    return frozenset(names)


def docstrings(path: Path):
    """(line, text) of the module's, each class's and each function's docstring, and of each
    comment (the issue's stale paths were in both)."""
    source = path.read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            text = ast.get_docstring(node, clean=False)
            if text:
                yield node.body[0].lineno, text
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def named_paths(text: str):
    """(what was written, the files or folders it may be, relative to a base) of each path of ours
    in `text`."""
    for m in PATH.finditer(text):
        path, attr = m.group("path"), m.group("attr")
        first = path.split("/")[0]
        if first not in folder_names() or (attr and attr[1:].lower() in DATA):
            continue
        if m.group("ext"):
            yield m.group(0), [f"{path}.{m.group('ext')}"]
        elif attr:  # models/image/lora.LoraSet: the module, a package, or a file of another kind
            yield m.group(0), [f"{path}.py", f"{path}/__init__.py", f"{path}{attr}"]
        else:
            yield m.group(0), [f"{path}/"]


def stale_paths() -> list[str]:
    stale = []
    for module in sorted(PACKAGE.rglob("*.py")):
        bases = (PACKAGE, REPO, module.parent)
        for line, text in docstrings(module):
            for written, candidates in named_paths(text):
                if not any((base / c).exists() for base in bases for c in candidates):
                    stale.append(f"{module.relative_to(REPO)}:{line}: {written}")
    return stale


def test_every_path_a_docstring_names_exists():
    stale = stale_paths()
    assert not stale, "docstrings or comments name paths that do not exist (correct the text):\n" + "\n".join(stale)


def test_the_path_finder_finds_our_paths_and_nothing_else():
    text = ("see app/web/whip.py, docs/security.md and tests/web/test_osc.py; models/image/lora.LoraSet and "
            "app/streams/ hold it; benchmarks/glass_to_glass.py prints; models/old_name.py is gone. Not: "
            "https://github.com/a/b.py, madebyollin/taesd, /studio/streams, frames/%05d.png, tests/*/test_*.py, "
            "RGB/BGR, 1/255, app/out.png, /tmp/x.py, gsplat/cuda/_torch_impl.py, DIR/jobs.json")
    assert [w for w, _ in named_paths(text)] == ["app/web/whip.py", "docs/security.md", "tests/web/test_osc.py",
                                                 "models/image/lora.LoraSet", "app/streams/",
                                                 "benchmarks/glass_to_glass.py", "models/old_name.py"]
