"""The `streamstudio` command. Each subcommand is two modules of `streamstudio/app/cli/`:

- `<name>.py`, its command module: `add_parser(subparsers)` (returning its parser) and, where the
  command has any, `check(args)`, the checks that need no model (ranges, output kind, input
  exists, port free). It imports nothing heavy (torch, diffusers, gradio, av).
- `<name>_run.py`, its runner: `run(args) -> int`, the body that loads models and runs, with what
  it needs imported at its top. (`render --pipeline video` goes on in render_video.py, which
  render_run.py imports by name when asked for: an installation may lack it.)

This file is the one place loading waits: `COMMANDS` names each command's module and `RUNNERS` its
runner ("module:function"). Only the named command's module is imported to parse, and its runner
once the command line parsed and `check` passed, so `--help`, argument errors and every check that
needs no model answer at once (benchmarks/cli_startup.py measures it)."""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import platform
import sys
import traceback

from streamstudio.errors import StreamStudioError

# subcommand name -> its command module under streamstudio.app.cli (parser, checks)
COMMANDS = {
    "serve": "serve",
    "generate": "generate",
    "render": "render",
    "splat": "splat",
    "train-video": "train_video",
    "train-image": "train_image",
    "build-engines": "build_engines",
    "bench": "bench",
}
# subcommand name -> its runner, "module:function" under streamstudio.app.cli (imported when it runs)
RUNNERS = {
    "serve": "serve_run:run",
    "generate": "generate_run:run",
    "render": "render_run:run",
    "splat": "splat_run:run",
    "train-video": "train_video_run:run",
    "train-image": "train_image_run:run",
    "build-engines": "build_engines_run:run",
    "bench": "bench_run:run",
}

# subcommand name -> its line in `streamstudio --help` (the top-level help imports no command)
SUMMARIES = {
    "serve": "the web app: live webcam, text to image, live output",
    "generate": "txt2img images, or img2img over a folder of images",
    "render": "render a video, images, a webcam or a pattern through a pipeline",
    "splat": "render a Gaussian-splat scene along a camera path to a video",
    "train-video": "train the StreamDiT-style streaming video model",
    "train-image": "train the built-in image model (autoencoder + one-step denoiser)",
    "build-engines": "export ONNX and build TensorRT engines into the engine cache",
    "bench": "measure the image pipeline's frame rate here, one or several streams",
}


def _chosen_command(argv: list[str] | None) -> str | None:
    """The subcommand named on the command line, if any (its module alone is imported, so
    `render` does not pay for importing the web app)."""
    for word in argv or []:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


VERBOSE_HELP = ("more detail: StreamStudio's debug log (device, threads, versions, stage failures) and, "
                "for an error, the chain of causes behind its one line")


def setup_logging(verbose: bool) -> None:
    """INFO for everyone; with `verbose`, DEBUG for StreamStudio's own loggers only (torch's,
    PIL's and the HTTP clients' debug output would bury ours)."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("streamstudio").setLevel(logging.DEBUG if verbose else logging.NOTSET)
    if verbose:
        import torch  # only with -v: start-up without it never loads torch

        log = logging.getLogger("streamstudio.cli")
        log.debug("python %s, torch %s, CUDA %s, %d CPU threads", platform.python_version(), torch.__version__,
                  torch.cuda.get_device_name(0) if torch.cuda.is_available() else "not available",
                  torch.get_num_threads())


def report_error(exc: StreamStudioError, verbose: bool) -> None:
    """One `error:` line; with `verbose`, the causes and where they were raised before it."""
    if verbose:
        traceback.print_exception(exc, file=sys.stderr)
    print(f"error: {exc}", file=sys.stderr)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser. Only the command named in `argv` gets its real parser (its module imported);
    every other command is listed by its summary alone. With `argv` None, every command's real
    parser (tests that parse several commands with one parser)."""
    parser = argparse.ArgumentParser(prog="streamstudio", description="StreamStudio: real-time generative media "
                                     "(stream-batched diffusion, streaming video, Gaussian splats)")
    parser.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = _chosen_command(argv)
    for name, module_name in COMMANDS.items():
        if argv is not None and name != chosen:
            sub.add_parser(name, help=SUMMARIES.get(name), add_help=False)  # listed, not built
            continue
        module = importlib.import_module(f"streamstudio.app.cli.{module_name}")
        sub_parser = module.add_parser(sub)
        # `-v` after the command too (`streamstudio render -v ...`); SUPPRESS keeps one given first
        sub_parser.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=VERBOSE_HELP)
        sub_parser.set_defaults(_run=RUNNERS[name], _check=getattr(module, "check", None), _parser=sub_parser)
    return parser


def runner(spec: str):
    """The function a RUNNERS entry names ("module:function" under streamstudio.app.cli), imported now."""
    module, _, function = spec.partition(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), function)


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """`argv` parsed; a word the command does not know is that command's error (its usage, and
    the nearest option it has), not the top-level parser's."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        own = getattr(args, "_parser", None) or parser
        known = [o for action in own._actions for o in action.option_strings if o.startswith("--")]
        flag = next((word.split("=", 1)[0] for word in extras if word.startswith("--")), None)
        near = difflib.get_close_matches(flag, known, n=1) if flag else []
        hint = f" (did you mean {near[0]}?)" if near else ""
        own.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    try:
        args = parse(parser, argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, said by argparse): the exit code
        return exc.code if isinstance(exc.code, int) else 2
    setup_logging(args.verbose)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        if args._check is not None:
            args._check(args)  # before the runner's imports: said at once
        return int(runner(args._run)(args) or 0)
    except StreamStudioError as exc:
        report_error(exc, args.verbose)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
