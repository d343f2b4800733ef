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
