"""The `streamstudio` command. Each subcommand lives in `streamstudio/app/commands/<name>.py`
and exposes `add_parser(subparsers)` (returning its parser) and `run(args) -> int`."""

from __future__ import annotations

import argparse
import importlib
import logging
import platform
import sys
import traceback

from streamstudio.errors import StreamStudioError

# subcommand name -> module under streamstudio.app.commands
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
        import torch

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
    """The parser with every command, or only the one named in `argv`."""
    parser = argparse.ArgumentParser(prog="streamstudio", description="StreamStudio: real-time generative media "
                                     "(stream-batched diffusion, streaming video, Gaussian splats)")
    parser.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = _chosen_command(argv)
    for name, module_name in COMMANDS.items():
        if chosen is not None and name != chosen:
            continue
        try:
            module = importlib.import_module(f"streamstudio.app.commands.{module_name}")
        except ModuleNotFoundError as exc:  # a command whose module is not written yet
            if exc.name == f"streamstudio.app.commands.{module_name}":
                continue
            raise
        sub_parser = module.add_parser(sub)
        # `-v` after the command too (`streamstudio render -v ...`); SUPPRESS keeps one given first
        sub_parser.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=VERBOSE_HELP)
        sub_parser.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except StreamStudioError as exc:
        report_error(exc, args.verbose)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
