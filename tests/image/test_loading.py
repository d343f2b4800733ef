"""Model loading: tiny, a save_pretrained folder, one .safetensors file, clear errors."""

from __future__ import annotations

import json
import socket
import threading
import time

import numpy as np
import pytest
import torch

from streamstudio.errors import ModelNotFoundError, StreamStudioError
from streamstudio.models import hub
from streamstudio.models.image import loading
from streamstudio.models.image.loading import (DEFAULT_MODEL, DEMO_NOTICE, load_components, resolve_demo_default,
                                               save_single_file)
from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion, StreamDiffusionConfig


def image(seed=0):
    return np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)


def run(comps):
    pipe = StreamDiffusion(comps, StreamDiffusionConfig(width=32, height=32, steps=2), prompt="a house")
    return pipe(image())


@pytest.fixture(scope="module")
def tiny():
    return load_components("tiny")


def assert_same_weights(a, b):
    for name in ("unet", "vae", "text_encoder"):
        sa, sb = getattr(a, name).state_dict(), getattr(b, name).state_dict()
        assert sa.keys() == sb.keys()
        for key in sa:
            torch.testing.assert_close(sa[key], sb[key], rtol=0, atol=0, msg=f"{name}.{key}")


def test_tiny_is_deterministic(tiny):
    other = load_components("tiny")
    assert_same_weights(tiny, other)
    assert tiny.is_demo and tiny.name == "tiny"


def rehome(comps):
    """Every weight copied into fresh memory (torch's allocator: 64-byte aligned)."""
    for name in ("unet", "vae", "text_encoder"):
        for p in getattr(comps, name).parameters():
            p.data = p.data.clone()
    return comps


def test_save_pretrained_folder_roundtrip(tiny, tmp_path):
    """What a save_pretrained folder promises: the same weights bit for bit, the same scheduler,
    and images within one level, not bit-identical ones.

    diffusers and transformers memory-map .safetensors files, so each loaded weight sits at its
    byte offset in the file, which safetensors aligns to 8 bytes only, while the weights built in
    memory sit at 64-byte aligned addresses. MKL's single-row matrix product (the UNet's time
    embedding, batch 1) takes another vectorised path for such data and sums in another order:
    1 ulp (1.2e-7) in one activation, which reaches the uint8 image as one level in 2 of its 3072
    values. The same weights copied into fresh memory give the bit-identical image, as the
    last check shows (and built-in weights moved to an 8-byte offset give the same 2 values off)."""
    for name in ("unet", "vae", "text_encoder", "tokenizer"):
        getattr(tiny, name).save_pretrained(tmp_path / name)
    (tmp_path / "scheduler").mkdir()
    (tmp_path / "scheduler" / "scheduler_config.json").write_text(
        json.dumps({"_class_name": "LCMScheduler", **tiny.scheduler_config}))
    loaded = load_components(str(tmp_path), lcm_lora=None)
    assert_same_weights(tiny, loaded)
    assert loaded.scheduler_config["beta_schedule"] == "scaled_linear"
    want, got = run(tiny).astype(int), run(loaded).astype(int)
    assert np.abs(want - got).max() <= 1 and (want != got).mean() < 0.01
    assert np.array_equal(run(rehome(loaded)), want)  # the memory layout was the only difference


def test_single_safetensors_roundtrip(tiny, tmp_path):
    path = save_single_file(tiny, tmp_path / "tiny.safetensors")
    loaded = load_components(str(path))
    assert_same_weights(tiny, loaded)
    assert loaded.tokenizer("a house").input_ids == tiny.tokenizer("a house").input_ids
    assert np.array_equal(run(tiny), run(loaded))


def test_missing_local_model_clear_error(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no such file") as info:
        load_components(str(tmp_path / "nope.safetensors"))
    assert "--model" in str(info.value)


def test_uncached_hub_model_clear_error():
    with pytest.raises(ModelNotFoundError) as info:
        load_components("streamstudio-test/not-a-model", local_files_only=True)
    message = str(info.value)
    assert "streamstudio-test/not-a-model" in message and "hf download" in message


def test_not_safetensors_file_rejected(tmp_path):
    bad = tmp_path / "model.ckpt"
    bad.write_bytes(b"\x80\x02pickle")
    with pytest.raises(StreamStudioError, match="not a .safetensors"):
        load_components(str(bad))


def test_demo_default_says_so(monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", "/nonexistent-cache")
    comps = resolve_demo_default("auto", device="cpu")
    assert comps.is_demo and comps.name == "builtin" and comps.default_size == 256
    assert any(DEMO_NOTICE in note and "built-in image model" in note for note in comps.notes)
    assert "hf download" in DEMO_NOTICE


# --- --model auto: each branch, with fakes for the GPU, the cache and the hub ------------------

class FakeHub:
    """sd-turbo's cache and hub as `resolve_demo_default` sees them."""

    def __init__(self, monkeypatch, cached=False, size=5_200_000_000, download_fails=False):
        self.cached, self.calls, self.downloads = cached, [], 0
        self.sd_turbo = object()
        real = loading.load_components

        def fake_load(model, **kw):
            self.calls.append((model, kw.get("local_files_only")))
            if model == DEFAULT_MODEL:
                if self.cached or not kw.get("local_files_only"):
                    return self.sd_turbo
                raise ModelNotFoundError("not in the cache")
            return real(model, **kw)

        def fake_download(repo=DEFAULT_MODEL, patterns=None):
            self.downloads += 1
            if download_fails:
                raise OSError("connection reset")
            self.cached = True
            return "/cache/sd-turbo"

        monkeypatch.setattr(loading, "load_components", fake_load)
        monkeypatch.setattr(loading, "hub_download_size", lambda *a, **k: size)
        monkeypatch.setattr(loading, "hub_unreachable", lambda *a, **k: None)  # (size None: the hub fails later)
        monkeypatch.setattr(loading, "download_model", fake_download)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)


def gpu(monkeypatch, present: bool):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: present)


def test_auto_without_gpu_is_builtin(monkeypatch):
    gpu(monkeypatch, False)
    hub = FakeHub(monkeypatch, cached=True)
    comps = resolve_demo_default("auto")
    assert comps.name == "builtin" and comps.is_demo
    assert "no CUDA GPU" in comps.notes[-1] and DEMO_NOTICE in comps.notes[-1]
    assert hub.downloads == 0 and all(m != DEFAULT_MODEL for m, _ in hub.calls)


def test_auto_with_gpu_uses_cached_sd_turbo(monkeypatch):
    gpu(monkeypatch, True)
    hub = FakeHub(monkeypatch, cached=True)
    assert resolve_demo_default("auto") is hub.sd_turbo
    assert hub.downloads == 0 and hub.calls == [(DEFAULT_MODEL, True)]


def test_auto_with_gpu_downloads_sd_turbo_with_a_size_notice(monkeypatch, caplog):
    gpu(monkeypatch, True)
    hub = FakeHub(monkeypatch, cached=False, size=5_200_000_000)
    with caplog.at_level("WARNING", logger="streamstudio.models.image.loading"):
        assert resolve_demo_default("auto") is hub.sd_turbo
    assert hub.downloads == 1
    notices = [r.getMessage() for r in caplog.records if "Downloading" in r.getMessage()]
    assert notices == [f"Downloading {DEFAULT_MODEL} (5.2 GB) into the Hugging Face cache; this happens once."]


def test_auto_with_gpu_offline_or_unreachable_is_builtin(monkeypatch):
    gpu(monkeypatch, True)
    hub = FakeHub(monkeypatch, cached=False, size=None)
    comps = resolve_demo_default("auto")
    assert comps.name == "builtin" and "cannot be reached" in comps.notes[-1] and hub.downloads == 0
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(loading, "hub_download_size", lambda *a, **k: pytest.fail("asked the hub while offline"))
    comps = resolve_demo_default("auto")
    assert comps.name == "builtin" and "HF_HUB_OFFLINE" in comps.notes[-1]


def test_auto_with_gpu_failed_download_is_builtin(monkeypatch):
    gpu(monkeypatch, True)
    hub = FakeHub(monkeypatch, cached=False, download_fails=True)
    comps = resolve_demo_default("auto")
    assert comps.name == "builtin" and "failed (connection reset)" in comps.notes[-1] and hub.downloads == 1


def test_auto_with_cpu_device_on_a_gpu_machine_is_builtin(monkeypatch):
    gpu(monkeypatch, True)
    hub = FakeHub(monkeypatch, cached=True)
    assert resolve_demo_default("auto", device="cpu").name == "builtin" and hub.calls[0][0] == "builtin"


def test_named_sd_turbo_always_means_sd_turbo(monkeypatch):
    for present in (False, True):
        gpu(monkeypatch, present)
        hub = FakeHub(monkeypatch, cached=False)
        assert resolve_demo_default(DEFAULT_MODEL) is hub.sd_turbo  # (the fake fetches when not local-only)
        assert hub.calls == [(DEFAULT_MODEL, None)]

    def missing(model, **kw):
        raise ModelNotFoundError("no")
    monkeypatch.setattr(loading, "load_components", missing)
    with pytest.raises(ModelNotFoundError):  # no silent fallback to the built-in model
        resolve_demo_default(DEFAULT_MODEL)


def test_hub_download_size_counts_what_loading_fetches(monkeypatch):
    import huggingface_hub
    from types import SimpleNamespace as NS

    files = {"unet/diffusion_pytorch_model.safetensors": 3_000, "unet/diffusion_pytorch_model.fp16.safetensors": 1_500,
             "vae/diffusion_pytorch_model.safetensors": 300, "text_encoder/model.safetensors": 1_000,
             "text_encoder/model.fp16.safetensors": 500, "tokenizer/vocab.json": 10, "unet/config.json": 1,
             "sd_turbo.safetensors": 5_000, "README.md": 7}
    info = NS(siblings=[NS(rfilename=k, size=v) for k, v in files.items()])
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", lambda self, repo, **kw: info)
    assert hub.hub_download_size(DEFAULT_MODEL, loading.SD_TURBO_FILES) == 3_000 + 300 + 1_000 + 10 + 1

    def unreachable(self, repo, **kw):
        raise OSError("Network is unreachable")
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", unreachable)
    assert hub.hub_download_size(DEFAULT_MODEL, loading.SD_TURBO_FILES) is None


def test_tiny_taesd(tiny):
    comps = load_components("tiny", taesd=True)
    assert type(comps.vae).__name__ == "AutoencoderTiny"
    out = run(comps)
    assert out.shape == (32, 32, 3)


def test_lcm_lora_fuse(tiny, tmp_path):
    """Fusing a LoRA through diffusers' loader changes the UNet by exactly W + scale * B @ A."""
    peft = pytest.importorskip("peft")
    from diffusers import StableDiffusionPipeline
    from peft.utils import get_peft_model_state_dict

    from streamstudio.models.image.loading import fuse_lora

    donor = load_components("tiny")
    torch.manual_seed(0)
    donor.unet.add_adapter(peft.LoraConfig(r=4, lora_alpha=4, target_modules=["to_q", "to_k", "to_v", "to_out.0"],
                                           init_lora_weights="gaussian"))
    layers = get_peft_model_state_dict(donor.unet)
    for value in layers.values():  # make B non-zero so the LoRA does something
        value.normal_(0, 0.1)
    StableDiffusionPipeline.save_lora_weights(tmp_path, unet_lora_layers=layers, safe_serialization=True)
    comps = load_components("tiny")
    key = next(k for k in layers if "to_q" in k and "lora_A" in k)
    module_path = key.replace(".lora_A.weight", "")
    before = comps.unet.get_submodule(module_path).weight.clone()
    fuse_lora(comps, str(tmp_path))
    after = comps.unet.get_submodule(module_path).weight
    a = layers[key]
    b = layers[key.replace("lora_A", "lora_B")]
    torch.testing.assert_close(after, before + b @ a, atol=1e-5, rtol=1e-5)


def test_loading_a_hub_model_prints_no_deprecation_noise(recwarn):
    """diffusers passes huggingface_hub a deprecated argument; its warning was on every command."""
    from streamstudio.models.image.loading import ModelNotFoundError, load_components

    with pytest.raises(ModelNotFoundError):
        load_components("streamstudio-test/not-a-model", local_files_only=True)
    assert not [w for w in recwarn if "local_dir_use_symlinks" in str(w.message)]


# --- offline or unreachable hub: one line at once, never a minute of retries ------------------

class CountingServer:
    """A TCP server on 127.0.0.1 standing in for a hub that cannot be reached: it counts the
    connections made to it and answers none (hang up at once, or hold the connection silent)."""

    def __init__(self, hang: bool):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.hang, self.connections, self.held = hang, 0, []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self):
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            if self.hang:
                self.held.append(conn)
            else:
                conn.close()

    def close(self):
        self.stopping.set()
        self.thread.join()
        for conn in self.held:
            conn.close()
        self.sock.close()


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache and no remembered answer of the hub."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setattr(hub, "_PROBES", {})
    return tmp_path / "hf" / "hub"


@pytest.fixture(params=["hangs up", "never answers"])
def unreachable_hub(request, empty_cache, monkeypatch):
    """The hub online in the environment's eyes (no HF_HUB_OFFLINE) but at an endpoint that never
    answers; the probe's timeout is shortened so the test is quick."""
    import huggingface_hub.constants

    server = CountingServer(hang=request.param == "never answers")
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # read at import (conftest sets it)
    monkeypatch.setattr(hub, "HUB_PROBE_TIMEOUT", 1.0)
    yield server
    server.close()


def assert_one_line_naming(message: str, repo: str):
    assert "\n" not in message and repo in message and f"`hf download {repo}`" in message


def test_offline_short_name_fails_at_once_with_the_full_id(empty_cache, monkeypatch):
    """`--model sd-turbo` offline: no hub request at all, one line naming stabilityai/sd-turbo and
    the exact command (not `hf download sd-turbo`, a repository that does not exist)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "hub_unreachable", lambda *a, **k: pytest.fail("asked the hub while offline"))
    start = time.monotonic()
    with pytest.raises(ModelNotFoundError) as info:
        load_components("sd-turbo")
    assert time.monotonic() - start < 3
    message = str(info.value)
    assert_one_line_naming(message, "stabilityai/sd-turbo")
    assert "HF_HUB_OFFLINE" in message and "--model builtin" in message and "hf download sd-turbo`" not in message


def test_a_bare_unknown_name_is_not_a_hub_id(empty_cache):
    with pytest.raises(ModelNotFoundError, match="owner/name") as info:
        load_components("my-model")
    assert "sd-turbo (stabilityai/sd-turbo)" in str(info.value)
    assert loading.hub_id("SDXL-Turbo") == "stabilityai/sdxl-turbo"


def test_unreachable_hub_fails_fast_after_one_connection(unreachable_hub, caplog, capfd):
    """No HF_HUB_OFFLINE, but the hub does not answer: one connection, no retry, one line within
    the probe's timeout; a second model in the same run asks nothing more."""
    start = time.monotonic()
    with caplog.at_level("DEBUG"), pytest.raises(ModelNotFoundError) as info:
        load_components("sd-turbo")
    assert time.monotonic() - start < hub.HUB_PROBE_TIMEOUT + 2
    message = str(info.value)
    assert_one_line_naming(message, "stabilityai/sd-turbo")
    assert unreachable_hub.url in message and "cannot be reached" in message
    with pytest.raises(ModelNotFoundError, match="stabilityai/sdxl-turbo"):
        load_components("sdxl-turbo")
    assert unreachable_hub.connections == 1
    said = capfd.readouterr().err + "\n".join(r.getMessage() for r in caplog.records)
    assert "Retry" not in said and "retry" not in said


def cache_as_hub_snapshot(folder, cache, repo: str):
    """`folder`'s files as the Hugging Face cache holds repo `repo` (refs/main -> a snapshot)."""
    import shutil

    root = cache / ("models--" + repo.replace("/", "--"))
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text("0" * 40)
    shutil.copytree(folder, root / "snapshots" / ("0" * 40))


def test_a_cached_hub_model_loads_without_asking_the_hub(sd15_folder, unreachable_hub, empty_cache):
    cache_as_hub_snapshot(sd15_folder, empty_cache, "someone/tiny-sd15")
    comps = load_components("someone/tiny-sd15", lcm_lora="none")
    assert comps.name == "someone/tiny-sd15" and unreachable_hub.connections == 0


# --- --lcm-lora auto | none | PATH | ID on an SD 1.5-like model --------------------------------

@pytest.fixture(scope="module")
def sd15_folder(tmp_path_factory):
    """A tiny diffusers folder shaped like SD 1.5 where --lcm-lora looks (768-wide text, so
    `auto` would fuse latent-consistency/lcm-lora-sdv1-5), written offline."""
    from diffusers import UNet2DConditionModel
    from transformers import CLIPTextModel

    from streamstudio.models.image import tiny as tiny_model

    parts = tiny_model.tiny_components()
    text_config = tiny_model._text_config()
    text_config.hidden_size, text_config.num_hidden_layers = 768, 1
    with torch.random.fork_rng(devices=[]):
        unet = UNet2DConditionModel(**{**tiny_model.UNET_CONFIG, "cross_attention_dim": 768})
        text_encoder = CLIPTextModel(text_config)
    folder = tmp_path_factory.mktemp("sd15")
    for name, module in (("unet", tiny_model.redraw_parameters(unet, 1)), ("vae", parts["vae"]),
                         ("text_encoder", tiny_model.redraw_parameters(text_encoder, 2, std=0.02)),
                         ("tokenizer", parts["tokenizer"])):
        module.save_pretrained(folder / name)
    (folder / "scheduler").mkdir()
    (folder / "scheduler" / "scheduler_config.json").write_text(
        json.dumps({"_class_name": "LCMScheduler", **parts["scheduler_config"]}))
    assert "lcm" not in str(folder).lower() and "turbo" not in str(folder).lower()  # names steer the choice
    return folder


def test_lcm_lora_none_runs_the_model_as_it_is_without_the_hub(sd15_folder, unreachable_hub):
    comps = resolve_demo_default(str(sd15_folder), lcm_lora="none")
    assert loading.is_sd15(comps) and loading.wants_lcm_lora(comps)
    assert comps.step_type == "lcm" and not any("LCM-LoRA fused" in n for n in comps.notes)
    assert any("--lcm-lora none" in n and "few-step" in n for n in comps.notes)
    assert run(comps).shape == (32, 32, 3)
    assert unreachable_hub.connections == 0


@pytest.mark.parametrize("form", ["file", "folder"])
def test_lcm_lora_local_path_is_fused(sd15_folder, unreachable_hub, tmp_path, form):
    """--lcm-lora PATH (a .safetensors file, or a folder holding pytorch_lora_weights.safetensors)
    is fused: each targeted weight moves by exactly alpha / rank * B @ A, read from the file."""
    pytest.importorskip("peft")
    from safetensors.torch import load_file

    from streamstudio.models.image.lora import save_random_lora

    base = load_components(str(sd15_folder), lcm_lora="none")
    rank, alpha = 4, 8
    path, _, _ = save_random_lora(base, tmp_path / "lcm", rank=rank, alpha=alpha, seed=3,
                                  file_name="lcm.safetensors" if form == "file" else None)
    fused = resolve_demo_default(str(sd15_folder), lcm_lora=str(path if form == "file" else path.parent))
    assert fused.step_type == "lcm" and any("LCM-LoRA fused" in n for n in fused.notes)
    state = load_file(str(path))
    checked = 0
    for key, a in state.items():
        if ".lora_A." not in key:
            continue
        module = key.removeprefix("unet.").replace(".lora_A.weight", "")
        b = state[key.replace(".lora_A.", ".lora_B.")]
        want = base.unet.get_submodule(module).weight + alpha / rank * b @ a
        torch.testing.assert_close(fused.unet.get_submodule(module).weight, want, atol=1e-6, rtol=1e-5)
        checked += 1
    assert checked >= 8  # to_q, to_k, to_v, to_out.0 of self- and cross-attention at least
    assert unreachable_hub.connections == 0


def test_lcm_lora_missing_path_is_a_clear_error(sd15_folder, tmp_path):
    with pytest.raises(ModelNotFoundError, match="no such file"):
        load_components(str(sd15_folder), lcm_lora=str(tmp_path / "nope.safetensors"))


def test_lcm_lora_auto_offline_fails_fast_naming_both_flags(sd15_folder, empty_cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(ModelNotFoundError) as info:
        load_components(str(sd15_folder))
    assert time.monotonic() - start < 5
    message = str(info.value)
    assert_one_line_naming(message, loading.LCM_LORA_SD15)
    assert "`--lcm-lora PATH`" in message and "`--lcm-lora none`" in message


def test_lcm_lora_auto_unreachable_fails_fast_naming_both_flags(sd15_folder, unreachable_hub):
    with pytest.raises(ModelNotFoundError) as info:
        load_components(str(sd15_folder), lcm_lora="auto")
    message = str(info.value)
    assert_one_line_naming(message, loading.LCM_LORA_SD15)
    assert "`--lcm-lora PATH`" in message and "`--lcm-lora none`" in message and "cannot be reached" in message
    assert unreachable_hub.connections == 1


def test_a_users_hub_lora_fails_fast_when_the_hub_cannot_be_reached(unreachable_hub, tiny_components_factory):
    """--lora owner/name goes the same way: one request, one line, the model left as it was."""
    pytest.importorskip("peft")
    from streamstudio.models.image.lora import LoraSet

    loras = LoraSet(tiny_components_factory())
    start = time.monotonic()
    with pytest.raises(ModelNotFoundError) as info:
        loras.add("someone/style:0.8")
    assert time.monotonic() - start < hub.HUB_PROBE_TIMEOUT + 2
    assert_one_line_naming(str(info.value), "someone/style")
    assert loras.listing() == [] and unreachable_hub.connections == 1


def test_addon_hub_ids_fail_fast_when_the_hub_cannot_be_reached(tiny, unreachable_hub):
    """A ControlNet or IP-Adapter hub id that is not cached, with a hub that does not answer: one
    line at once naming the command that fetches it (they went through huggingface_hub's retries
    for a minute before)."""
    from streamstudio.models.image.controlnet import load_controlnet
    from streamstudio.models.image.ip_adapter import IPAdapter

    canny = "lllyasviel/control_v11p_sd15_canny"
    for load, repo in ((lambda: load_controlnet(canny), canny),
                       (lambda: IPAdapter(tiny, "h94/IP-Adapter"), "h94/IP-Adapter")):
        start = time.monotonic()
        with pytest.raises(ModelNotFoundError) as info:
            load()
        assert time.monotonic() - start < 8
        assert_one_line_naming(str(info.value), repo)
