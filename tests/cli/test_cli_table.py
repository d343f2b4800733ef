"""The bad-invocation table (issue 28): every number flag of every subcommand, found by walking
the parser (so a flag added later is in the table with no other line), is given values no flag
may take: nan, +-inf, text, an absurd size (1e30 / 10**30) and a negative absurd size. Each must
be the command's usage error while the command line is parsed (exit code 2, one `error:` line
naming the flag, no traceback), never a run: the parse never reaches the command, so a value that
parses is counted as a wrong success instead of hanging the test. The issue's own list of
invocations that hung, crashed or succeeded wrongly runs through `main` beside it."""

from __future__ import annotations

import argparse
import contextlib
import io

from streamstudio.app.cli import COMMANDS, build_parser, parse

# each command with the arguments it needs to parse (the base must parse: checked below)
BASE = {
    "serve": ["serve"],
    "generate": ["generate", "--output", "o"],
    "render": ["render", "--input", "pattern", "--output", "o.mp4"],
    "splat": ["splat", "sample", "--output", "o.mp4"],
    "train-video": ["train-video"],
    "train-image": ["train-image"],
    "build-engines": ["build-engines"],
    "bench": ["bench"],
}
# values no number flag may take, whatever its range
BAD_VALUES = ["nan", "inf", "-inf", "NaN", "abc", "", "1e30", "-1e30", str(10**30), str(-10**30)]


def number_flags(command: str) -> list[tuple[str, int]]:
    """(flag, how many values it takes) of every option of `command` whose type is a number."""
    parser = build_parser([command])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    flags = []
    for action in sub.choices[command]._actions:
        kind = getattr(action.type, "kind", None) or action.type
        if action.option_strings and kind in (int, float):
            count = action.nargs if isinstance(action.nargs, int) else 1
            flags.append((action.option_strings[-1], count))
    return flags


def parse_outcome(argv: list[str]) -> tuple[int, str]:
    """(exit code, stderr) of parsing `argv`; 0 when it parses (the command would run)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parse(build_parser(argv), argv)
        except SystemExit as exc:
            return (exc.code if isinstance(exc.code, int) else 2), err.getvalue()
    return 0, err.getvalue()


# the issue's own list of numbers that hung, crashed or succeeded wrongly (beside the table's values)
ISSUE_CASES = [
    (["render", "--input", "pattern", "--output", "o.mp4", "--fps", "1e9"], "--fps"),  # hung
    (["generate", "--output", "o", "--width", "100000"], "--width"),  # hung
    (["serve", "--port", "-1"], "--port"),
    (["serve", "--port", "70000"], "--port"),
    (["serve", "--idle-timeout", "-5"], "--idle-timeout"),
    (["render", "--pipeline", "video", "--output", "o.mp4", "--frames", "0"], "--frames"),  # wrote 48 frames
    (["train-video", "--steps", "-1"], "--steps"),  # "nothing to do", exit 0
    (["train-image", "--steps", "-1"], "--steps"),
    (["build-engines", "--width", "0"], "--width"),  # exported
    (["train-video", "--size", "0"], "--size"),
    (["train-video", "--batch-size", "0"], "--batch-size"),
    (["train-image", "--vae-batch-size", "0"], "--vae-batch-size"),
    (["splat", "sample", "--output", "o.mp4", "--elevation", "90"], "--elevation"),  # the camera's up is its view
]


def table() -> list[tuple[str, list[str], str]]:
    """(case id, argv, the flag the error must name)."""
    cases = [(" ".join(argv), argv, flag) for argv, flag in ISSUE_CASES]
    for command in COMMANDS:
        for flag, count in number_flags(command):
            for value in BAD_VALUES:
                values = [value] * count
                cases.append((f"{command} {flag} {value!r}", [*BASE[command], flag, *values], flag))
    return cases


TABLE = table()


def test_the_table_covers_every_subcommand_with_at_least_150_invocations():
    commands = {case.split()[0] for case, _, _ in TABLE}
    assert commands == set(COMMANDS)
    assert len(TABLE) >= 150, len(TABLE)
    for command, argv in BASE.items():  # the base parses: a refusal below is the bad value's
        assert parse_outcome(argv)[0] == 0, (command, parse_outcome(argv)[1])


def test_no_bad_number_reaches_a_command():
    """All of the table at once, so the closing figure is one line: wrong successes, tracebacks,
    and errors that do not name their flag."""
    wrong_success, traceback, unnamed = [], [], []
    for case, argv, flag in TABLE:
        rc, err = parse_outcome(argv)
        if rc == 0:
            wrong_success.append(case)
            continue
        if "Traceback" in err:
            traceback.append(case)
        errors = [line for line in err.splitlines() if "error:" in line]
        if rc != 2 or len(errors) != 1 or flag not in errors[0]:
            unnamed.append(f"{case}: rc {rc}: {err[-300:]}")
    assert (wrong_success, traceback, unnamed) == ([], [], []), \
        f"{len(TABLE)} invocations: {len(wrong_success)} wrong successes {wrong_success[:20]}, " \
        f"{len(traceback)} tracebacks, {len(unnamed)} bad messages {unnamed[:5]}"
