"""`streamstudio bench` with the tiny model: one stream's frame rate, several streams over one
model (batched and taking turns), JSON output, and clear errors."""

from __future__ import annotations

import json

import pytest

from streamstudio.app import cli

TINY = ["--model", "tiny", "--device", "cpu"]


@pytest.fixture(autouse=True)
def only_bench_command(monkeypatch):
    monkeypatch.setattr(cli, "COMMANDS", {"bench": "bench"})


def test_one_stream_prints_and_writes_its_figures(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert cli.main(["bench", *TINY, "--frames", "6", "--warmup", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "tiny" in text and "64x64" in text and "img2img:" in text and "fps" in text
    assert "median" in text and "ms per frame" in text  # the per-frame figure says which statistic it is
    result = json.loads(out.read_text())
    assert result["frames"] == 6 and result["fps"] > 0 and result["ms_p90"] >= result["ms_median"] > 0
    assert result["device"].startswith("CPU") and "date" in result


def test_txt2img(capsys):
    assert cli.main(["bench", *TINY, "--frames", "3", "--warmup", "0", "--txt2img"]) == 0
    assert "txt2img:" in capsys.readouterr().out


@pytest.mark.parametrize("batching", [True, False])
def test_several_streams_over_one_model(tmp_path, capsys, batching):
    out = tmp_path / "streams.json"
    argv = ["bench", *TINY, "--streams", "2", "--seconds", "1.5", "--json", str(out)]
    assert cli.main(argv + ([] if batching else ["--no-stream-batching"])) == 0
    result = json.loads(out.read_text())
    assert result["streams"] == 2 and len(result["per_stream_fps"]) == 2 and min(result["per_stream_fps"]) > 0
    assert result["mode"] == ("batched" if batching else "taking turns")
    if batching:
        assert result["requests_per_call"] >= 1.0
    else:
        assert result["requests_per_call"] is None
    assert "2 streams" in capsys.readouterr().out


@pytest.mark.parametrize("argv, words, code", [
    (["--frames", "0"], "--frames", 2),  # numbers: the usage error of their range (tests/cli/test_cli_table.py)
    (["--streams", "0"], "--streams", 2),
    (["--streams", "2", "--txt2img"], "no --txt2img", 1),
])
def test_bad_values_are_clear_errors(capsys, argv, words, code):
    assert cli.main(["bench", *TINY, *argv]) == code
    assert words in capsys.readouterr().err
