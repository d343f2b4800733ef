"""The house's shape, read from the sources' syntax trees (issue 27): imports point down the
layers (app -> streaming -> pipelines -> models -> kernels), nothing imports `app/cli/` (the
commands are argument parsers over `app/streams/`), the front ends' folders (app/web, app/batch,
app/training), the products' model folders (models/image, models/video, models/splats) and their
pipeline folders (pipelines/image, pipelines/video, pipelines/splats) do not import each other, a
stream opens in one place, and no new import circle appears. Imports inside functions count: a
circle closed at run time is still one. Imports under `if TYPE_CHECKING:` (for the type checker,
never run) must point down the layers like the others but close no circle: they are how a module
names a type of a module that imports it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "streamstudio"
LAYERS = {"kernels": 0, "models": 1, "pipelines": 2, "streaming": 3, "app": 4}

# Circles still to break (issue 27): none.
KNOWN_CIRCLES: list[set[str]] = []


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def typing_only(tree: ast.AST) -> set[int]:
    """The ids of the nodes under an `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`) of `tree`."""
    guarded = [node for node in ast.walk(tree) if isinstance(node, ast.If)
               and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"]
    return {id(inner) for node in guarded for stmt in node.body for inner in ast.walk(stmt)}


def import_graph(typing: bool = True) -> dict[str, set[str]]:
    """module -> the package's modules it imports (at its top or inside functions; `typing`
    False: without those only the type checker reads)."""
    mods = modules()
    graph = {name: set() for name in mods}
    for name, path in mods.items():
        tree = ast.parse(path.read_text())
        skip = set() if typing else typing_only(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("streamstudio"):
                targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in mods and t != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 else None


def test_imports_point_down_the_layers():
    up = [f"{a} -> {b}" for a, targets in import_graph().items() for b in targets
          if layer(a) is not None and layer(b) is not None and layer(b) > layer(a)]
    assert up == []


def test_nothing_imports_the_commands():
    graph = import_graph()
    reaching = sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                      if b.startswith("streamstudio.app.cli") and not a.startswith("streamstudio.app.cli")
                      and a != "streamstudio.__main__")
    assert reaching == []  # (app/cli/__init__.py imports the named command by its name, at run time)


SIBLINGS = {"streamstudio.app": ("web", "batch", "training"), "streamstudio.models": ("image", "video", "splats"),
            "streamstudio.pipelines": ("image", "video", "splats")}


def folder(module: str) -> str | None:
    for parent, names in SIBLINGS.items():
        for name in names:
            if module == f"{parent}.{name}" or module.startswith(f"{parent}.{name}."):
                return f"{parent}.{name}"
    return None


def test_front_ends_and_products_do_not_import_each_other():
    """The web server, batch rendering and training share only app/streams and app/settings; the
    image, video and splat models share only models/' own modules (hub, acceleration), and their
    pipelines only pipelines/' own (live_settings)."""
    across = sorted(f"{a} -> {b}" for a, targets in import_graph().items() for b in targets
                    if folder(a) and folder(b) and folder(a) != folder(b) and layer(a) == layer(b))
    assert across == []
    assert all((PACKAGE / parent.split(".")[1] / name / "__init__.py").is_file()
               for parent, names in SIBLINGS.items() for name in names)


def test_no_new_import_circle():
    found = circles(import_graph(typing=False))
    new = [sorted(c) for c in found if c not in KNOWN_CIRCLES]
    assert new == [], f"new import circles: {new}"
    gone = [sorted(c) for c in KNOWN_CIRCLES if c not in found]
    assert gone == [], f"broken circles still listed as known (take them out of KNOWN_CIRCLES): {gone}"


def test_the_graph_sees_a_circle_made_inside_a_function():
    """The check itself: two modules importing each other, one of them inside a function."""
    graph = {"a": {"b"}, "b": {"a"}, "c": {"a"}}
    assert circles(graph) == [{"a", "b"}]


def test_imports_for_the_type_checker_only_are_told_apart():
    """The check itself: an import under `if TYPE_CHECKING:` is marked, one beside it is not."""
    tree = ast.parse("from typing import TYPE_CHECKING\nimport a\nif TYPE_CHECKING:\n    import b\n"
                     "def f():\n    import c\n")
    marked = typing_only(tree)
    names = {alias.name: id(node) in marked for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}
    assert names == {"a": False, "b": True, "c": False}


def test_an_image_stream_is_made_in_one_place():
    """`StreamDiffusion(` is called only by app/streams/image.py's new_stream (it was called in
    four places, one of which loaded its own model and rounded sizes its own way)."""
    calls = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call)
                    and getattr(node.func, "id", getattr(node.func, "attr", None)) == "StreamDiffusion"):
                calls.append(name)
    assert calls == ["streamstudio.app.streams.image"]
