"""`-v` adds detail (issue 14, rough edge 7): it is accepted before or after the command, turns on
StreamStudio's own debug log (versions, device, threads) and shows the causes behind a user
error's one line; without it a user error stays one `error:` line."""

from __future__ import annotations

import logging

import pytest

from streamstudio.app.cli import main

BAD = ["splat", "/nonexistent/scene.ply", "--frames", "1"]  # fails before loading anything: no --output


@pytest.fixture(autouse=True)
def _restore_logging():
    yield
    logging.getLogger("streamstudio").setLevel(logging.NOTSET)


def test_user_error_is_one_line_without_v(capsys):
    assert main(BAD) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert [line for line in err.splitlines() if line.strip()] == [err.strip()]
    assert err.startswith("error: --output is required")


@pytest.mark.parametrize("argv", [["-v", *BAD], [*BAD, "-v"], [BAD[0], "--verbose", *BAD[1:]]])
def test_v_anywhere_shows_the_cause_chain(argv, capsys):
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert "streamstudio/app/cli/splat.py" in err  # where it was raised
    assert err.rstrip().splitlines()[-1].startswith("error: --output is required")  # the one line stays last


def test_v_logs_streamstudio_debug_only(caplog):
    main([*BAD, "-v"])
    ours = [r for r in caplog.records if r.name.startswith("streamstudio") and r.levelno == logging.DEBUG]
    assert any("torch" in r.getMessage() and "threads" in r.getMessage() for r in ours)
    assert logging.getLogger("PIL").getEffectiveLevel() > logging.DEBUG  # other libraries' debug stays off
    caplog.clear()
    main(BAD)
    assert not [r for r in caplog.records if r.levelno == logging.DEBUG and r.name.startswith("streamstudio")]
