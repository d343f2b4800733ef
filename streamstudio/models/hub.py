"""The Hugging Face hub as StreamStudio meets it, shared by the products (at models/' root: the
image models' loading and add-ons, the video model's Wan checkpoints and the CLI all use it): the
hub ids the project names, short names for them, the local cache (asked without the network),
whether the hub can be reached (one bounded request, remembered a minute), how big a repository's
files are, fetching them, and the command that fetches a repository. Imports no torch or diffusers
(huggingface_hub only where asked), so the CLI can say at once that a model cannot be had
(`check_model_source`), before any model code loads; `models/image/loading.py` builds on it."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import warnings
from pathlib import Path
from fnmatch import fnmatch

from streamstudio.errors import ModelNotFoundError

log = logging.getLogger(__name__)

DEFAULT_MODEL = "stabilityai/sd-turbo"
LCM_LORA_SD15 = "latent-consistency/lcm-lora-sdv1-5"
LCM_LORA_SDXL = "latent-consistency/lcm-lora-sdxl"
TAESD_SD = "madebyollin/taesd"
TAESD_SDXL = "madebyollin/taesdxl"
LOCAL_NAMES = ("auto", "builtin", "tiny", "tiny-sdxl")  # models that never come from the hub


def download_command(model: str) -> str:
    """The command that fetches `model` into the Hugging Face cache (huggingface_hub's `hf` CLI;
    `huggingface-cli` is deprecated and no longer works in the installed huggingface_hub)."""
    return f"hf download {model}"


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def truthy(value: str) -> bool:
    return value not in ("0", "", "false", "False")


def offline() -> bool:
    return any(truthy(os.environ.get(k, "0")) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


# Well-known short names and the hub ids they stand for (a hub id is owner/name: `hf download
# sd-turbo` fetches nothing).
SHORT_NAMES = {
    "sd-turbo": "stabilityai/sd-turbo",
    "sdxl-turbo": "stabilityai/sdxl-turbo",
    "sd-1.5": "stable-diffusion-v1-5/stable-diffusion-v1-5",
    "sd15": "stable-diffusion-v1-5/stable-diffusion-v1-5",
    "sdxl": "stabilityai/stable-diffusion-xl-base-1.0",
    "lcm-lora-sdv1-5": LCM_LORA_SD15,
    "lcm-lora-sdxl": LCM_LORA_SDXL,
    "taesd": TAESD_SD,
    "taesdxl": TAESD_SDXL,
}

HUB_PROBE_TIMEOUT = 3.0  # seconds the one request that tells whether the hub can be reached may take
HUB_PROBE_TTL = 60.0  # seconds its answer is trusted (one load asks about several repositories)
_PROBES: dict[str, tuple[float, str | None]] = {}  # endpoint -> (when, why not reachable or None)
_PROBE_LOCK = threading.Lock()


def hub_id(name: str, kind: str = "model") -> str:
    """The full hub id (owner/name) that `name` stands for: itself, or a well-known short name's
    id; any other name without a slash is refused with a clear message."""
    if "/" in name:
        return name
    if name.lower() in SHORT_NAMES:
        return SHORT_NAMES[name.lower()]
    names: dict[str, list[str]] = {}
    for short, full in SHORT_NAMES.items():
        if kind != "model" or not short.startswith(("lcm-", "taesd")):
            names.setdefault(full, []).append(short)
    known = ", ".join(f"{' / '.join(shorts)} ({full})" for full, shorts in names.items())
    raise ModelNotFoundError(f"{kind} {name!r} is neither a local file or folder nor a hub id: a Hugging Face hub "
                             f"id is owner/name, e.g. {DEFAULT_MODEL}; short names known here: {known}")


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, read from the environment now (HF_HUB_CACHE, HF_HOME) as
    huggingface_hub reads it at import."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.path.expanduser(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        return Path(os.path.expanduser(os.environ["HF_HOME"])) / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def cached_file(repo: str, filename: str) -> Path | None:
    """`filename` of hub repo `repo` (main revision) in the local cache, or None. Asks nothing
    of the network."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo, filename, cache_dir=hub_cache_dir())
    except Exception as exc:  # a malformed id, an unreadable cache: not cached
        log.debug("cache lookup of %s/%s failed: %s", repo, filename, first_line(exc))
        return None
    return Path(found) if isinstance(found, str) else None


def cached_snapshot(repo: str, needs: str) -> Path | None:
    """The local snapshot folder of hub repo `repo` when the cache holds its file `needs`."""
    found = cached_file(repo, needs)
    return None if found is None else found.parents[len(Path(needs).parts) - 1]


def hub_endpoint() -> str:
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def hub_unreachable(repo: str = DEFAULT_MODEL, timeout: float | None = None) -> str | None:
    """None when the hub answers (any HTTP status) one HEAD request within `timeout` seconds
    (HUB_PROBE_TIMEOUT), else why not, as words that finish "... and ": one request, no retries,
    bounded also while a name lookup hangs; the answer is kept HUB_PROBE_TTL seconds per endpoint."""
    endpoint = hub_endpoint()
    timeout = HUB_PROBE_TIMEOUT if timeout is None else timeout
    with _PROBE_LOCK:
        known = _PROBES.get(endpoint)
        if known is not None and time.monotonic() - known[0] < HUB_PROBE_TTL:
            return known[1]
        outcome: list[str | None] = [f"no answer in {timeout:g} s"]

        def probe() -> None:
            from huggingface_hub import get_session, hf_hub_url

            try:
                get_session().head(hf_hub_url(repo, "model_index.json", endpoint=endpoint), timeout=timeout,
                                   follow_redirects=False)
                outcome[0] = None
            except Exception as exc:  # DNS, refused, reset, timeout, proxy, offline mode: not reachable now
                outcome[0] = f"{type(exc).__name__}: {first_line(exc)}"

        thread = threading.Thread(target=probe, name="hub-probe", daemon=True)
        thread.start()
        thread.join(timeout + 0.5)
        why = outcome[0]
        reason = None if why is None else f"the hub ({endpoint}) cannot be reached ({why})"
        _PROBES[endpoint] = (time.monotonic(), reason)
    if reason:
        log.debug("%s", reason)
    return reason


def hub_repo_source(repo: str, needs: str, what: str, local_files_only: bool, instead: str) -> bool:
    """For a hub repo an add-on loads from (a ControlNet, an IP-Adapter): True when the local cache
    holds its file `needs` (load from the cache alone, no request), False when the hub answers;
    otherwise a one-line ModelNotFoundError at once with the command that fetches it and
    `instead` (what else the user can do), before huggingface_hub's retries could start."""
    if cached_file(repo, needs) is not None:
        return True
    reason = hub_off(local_files_only)
    if reason:
        raise ModelNotFoundError(f"{what} is not in the local Hugging Face cache and {reason}: run "
                                 f"`{download_command(repo)}` where the hub can be reached, {instead}.")
    return False


def hub_off(local_files_only: bool) -> str | None:
    """Why the hub may not be asked now (words that finish "... and "), or None when it answers."""
    if offline():
        var = next(k for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE") if truthy(os.environ.get(k, "0")))
        return f"the hub is switched off ({var}={os.environ[var]})"
    if local_files_only:
        return "only local files were to be used"
    return hub_unreachable()


def looks_like_path(name: str) -> bool:
    """A name that can only mean a file or folder (never a hub id, which is owner/name)."""
    return name.endswith(".safetensors") or name.startswith((".", "/", "~")) or name.count("/") > 1


def check_model_source(model: str) -> None:
    """Before any model code loads (the CLI, at once): a `--model` that is a hub id must be in the
    local cache or the hub must answer; otherwise the one-line ModelNotFoundError loading would
    raise later, with the full repository id and the command that fetches it. Local names,
    files and folders pass (their loading says what is wrong with them)."""
    if model in LOCAL_NAMES or Path(os.path.expanduser(model)).exists() or looks_like_path(model):
        return
    repo = hub_id(model)
    if cached_file(repo, "unet/config.json") is not None or cached_file(repo, "model_index.json") is not None:
        return
    reason = hub_off(False)
    if reason:
        raise not_cached(model, repo, reason)


def not_cached(model: str, repo: str, reason: str) -> ModelNotFoundError:
    called = repo if model == repo else f"{model!r} ({repo})"
    return ModelNotFoundError(
        f"model {called} is not in the local Hugging Face cache and {reason}: run `{download_command(repo)}` "
        f"where the hub can be reached (the cache is {hub_cache_dir()}), or pass --model with a local diffusers "
        f"folder or .safetensors file; `--model builtin` runs the small built-in model now.")


@contextlib.contextmanager
def quiet_hub():
    """diffusers still passes huggingface_hub an argument it has deprecated, and every command
    printed the hub's warning about it: not the user's to act on."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*local_dir_use_symlinks.*", category=UserWarning)
        yield


def hub_download_size(repo: str, patterns: list[str], timeout: float = 10.0) -> int | None:
    """Bytes of the files of `repo` that match `patterns` (what loading it fetches), or None when
    the hub cannot be reached."""
    from huggingface_hub import HfApi

    try:
        info = HfApi().model_info(repo, files_metadata=True, timeout=timeout)
    except Exception as exc:  # no network, DNS, proxy, HTTP errors: all mean "not reachable now"
        log.debug("the hub cannot be reached: %s", first_line(exc))
        return None
    return sum(int(f.size or 0) for f in info.siblings or () if any(fnmatch(f.rfilename, p) for p in patterns))


def download_model(repo: str, patterns: list[str]) -> str:
    """Fetch `repo`'s files that match `patterns` into the Hugging Face cache, with huggingface_hub's
    own progress bars."""
    from huggingface_hub import snapshot_download

    with quiet_hub():
        return snapshot_download(repo, allow_patterns=patterns)


def fetch_file(repo: str, filename: str) -> Path:
    """One file of hub repo `repo`: from the local cache, else downloaded when the hub can be
    reached (huggingface_hub's progress bar); a clear error when neither."""
    from huggingface_hub import hf_hub_download

    found = cached_file(repo, filename)
    if found is not None:
        return found
    why = hub_off(False)
    if why:
        raise not_cached(f"{repo}:{filename}", repo, why)
    log.warning("Downloading %s from %s into the Hugging Face cache; this happens once.", filename, repo)
    try:
        with quiet_hub():
            return Path(hf_hub_download(repo, filename))
    except Exception as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise not_cached(f"{repo}:{filename}", repo, f"the download failed ({first_line(exc)})") from exc
