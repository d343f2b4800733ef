"""Training of the causal video model (issue 49): flow matching with teacher forcing.

The network is the block-causal Wan of `models/video/causal_wan.py`, pixel space (the tokens are
patches of the [-1, 1] frames, as the StreamDiT built-in). A training clip of F frames is cut into
chunks of c frames; each chunk gets its own noise level sigma ~ U(0, 1) (Wan's timestep 1000 sigma),
x = (1 - sigma) data + sigma noise, and the target is Wan's output, noise - data. The clip goes
through the network once as [clean frames; noisy frames] (`CausalWan.teacher_forcing`, CausVid's
and Self-Forcing's teacher forcing): each noisy chunk sees the clean chunks before it as the
sampler's KV cache shows it the chunks it made (committed at t = 0), within the sampler's window.
With `cond_drop` a share of the clips is trained with the empty prompt, so the sampler can
guide against it (`CausalConfig.guidance`, as the StreamDiT built-in is sampled at guidance 3).
With `first_chunks` each step also trains that many more clips as a stream's first chunk alone:
the chunk made from the prompt with nothing before it, where the object and its direction are
settled, is a third of a 6-frame clip's loss but the hardest part of it (a model trained without
it continued a clip's motion from its past but drew its first two frames out of step).
With `self_context` a share of the clips read, instead of the data's frames, the model's own
prediction of each clean chunk from the sampler's last step's noise level (given the data's past,
no gradient): what a stream reads is the output of that step, with that step's errors, and a model
that only read the data's frames let them grow chunk after chunk (from a correct first chunk the
shipped model kept the prompted direction in 5 of 8 rollouts). With `self_rollout` those chunks are
made one after another, each reading the model's own chunks before it (its errors carried on, as
in a stream) instead of the data's.
With `context_noise` the clean frames the noisy chunks read are shown with a little noise (each
chunk's own sigma in [0, context_noise], still labelled t = 0): the frames a stream reads are its
own, not the data's, and a model that only ever read clean frames drifts on them.

Every batch, level and noise sample is seeded by (seed, step), so a resumed run continues exactly
where the stopped one would have been. Checkpoints are the project's causal format
(`save_causal_checkpoint`: config.json + model.safetensors) with `optimizer.pt` and
`trainer_state.json` beside them; the text encoder is `wan.HashTextEmbedder`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, replace
from pathlib import Path

import torch
from safetensors.torch import load_file

from streamstudio.app.training.config import CausalTrainConfig
from streamstudio.app.training.loop import Schedule, Stepper, run_steps
from streamstudio.errors import StreamStudioError
from streamstudio.models.video import wan
from streamstudio.models.video.causal_checkpoint import save_causal_checkpoint
from streamstudio.models.video.causal_wan import CausalText, CausalWan, CausalWanConfig
from streamstudio.models.video.video_data import VideoFolder, synthetic_batch
from streamstudio.pipelines.video.causal_video import CausalConfig

log = logging.getLogger(__name__)


def model_config(cfg: CausalTrainConfig) -> CausalWanConfig:
    return CausalWanConfig(dim=cfg.dim, ffn_dim=cfg.ffn_dim, freq_dim=64, text_dim=cfg.text_dim,
                           text_len=cfg.text_len, in_dim=3, out_dim=3, num_heads=cfg.heads, num_layers=cfg.layers,
                           patch_size=(1, cfg.patch, cfg.patch))


def window_of(cfg: CausalTrainConfig) -> int:
    return cfg.window or max(cfg.frames, first_chunk_of(cfg))


def first_chunk_of(cfg: CausalTrainConfig) -> int:
    """Frames of a stream's first chunk (the `first_chunks` clips', the sampler's first)."""
    return cfg.first_chunk_frames or cfg.chunk_frames


def check(cfg: CausalTrainConfig) -> None:
    """The run's shape, checked before anything is built (errors a user can cause)."""
    if cfg.frames % cfg.chunk_frames:
        raise StreamStudioError(f"the clip's {cfg.frames} frames must be whole chunks of {cfg.chunk_frames}")
    if cfg.first_chunk_frames and not cfg.first_chunks:
        raise StreamStudioError("--first-chunk-frames is the length of the --first-chunks clips: "
                                "give --first-chunks too")
    if cfg.self_rollout and not cfg.self_context:
        raise StreamStudioError("--self-rollout makes the --self-context clips' chunks one by one: "
                                "give --self-context too (e.g. 0.5)")
    if cfg.size % cfg.patch:
        raise StreamStudioError(f"--size {cfg.size} must be a multiple of the patch {cfg.patch}")
    if cfg.dim % cfg.heads or (cfg.dim // cfg.heads) % 2 or cfg.dim // cfg.heads < 12:
        raise StreamStudioError(f"--dim {cfg.dim} must split into {cfg.heads} heads of an even size >= 12")
    sampling = CausalConfig(chunk_frames=cfg.chunk_frames, window=window_of(cfg), sink=cfg.sink,
                            steps=tuple(cfg.sampling["steps"]), first_chunk_frames=first_chunk_of(cfg))
    try:
        sampling.validate()
    except StreamStudioError as exc:
        raise StreamStudioError(f"the sampling this model is trained for does not hold: {exc}") from exc


def draw(cfg: CausalTrainConfig, data, step: int) -> tuple[torch.Tensor, list[str], torch.Tensor, torch.Tensor,
                                                            torch.Tensor]:
    """Step `step`'s clips (B, F, 3, H, W), captions, per-frame sigmas (B, F) (one per chunk), noise
    (B, F, 3, H, W) and the clean frames as the noisy chunks read them (B, F, 3, H, W): all seeded
    by (seed, step)."""
    seed = (cfg.seed * 1_000_003 + step) * 64
    if data is None:
        clips, caps = synthetic_batch(seed, cfg.batch_size, cfg.frames, cfg.size)
    else:
        clips, caps = data.batch(seed, cfg.batch_size, cfg.frames)
    gen = torch.Generator().manual_seed(seed)
    sigma = torch.rand(cfg.batch_size, cfg.frames // cfg.chunk_frames, generator=gen)
    noise = torch.randn(clips.shape, generator=gen)
    context = clips
    if cfg.context_noise:
        c = cfg.context_noise * torch.rand(cfg.batch_size, cfg.frames // cfg.chunk_frames, generator=gen)
        c = c.repeat_interleave(cfg.chunk_frames, dim=1)[:, :, None, None, None]  # (B, F, 1, 1, 1)
        context = (1 - c) * clips + c * torch.randn(clips.shape, generator=gen)
    if cfg.cond_drop:  # (drawn last: a run without it draws what it always drew)
        dropped = torch.rand(cfg.batch_size, generator=gen) < cfg.cond_drop
        caps = ["" if d else cap for cap, d in zip(caps, dropped.tolist())]
    return clips, caps, sigma.repeat_interleave(cfg.chunk_frames, dim=1), noise, context


def text_batch(encoder: wan.HashTextEmbedder, captions: list[str], length: int) -> torch.Tensor:
    """(B, length, dim) hash embeddings of the captions, zero-padded (as `CausalWan.embed_text` pads)."""
    out = torch.zeros(len(captions), length, encoder.dim)
    for i, caption in enumerate(captions):
        e = encoder(caption)[0, :length]  # (L, dim)
        out[i, :e.shape[0]] = e
    return out


class CausalTrainer(Stepper):
    """`CausalTrainer(cfg).train()` -> the losses of the steps run."""

    def __init__(self, cfg: CausalTrainConfig):
        check(cfg)
        self.cfg = cfg
        self.device = torch.device("cuda" if torch.cuda.is_available() and not cfg.cpu else "cpu")
        self.out = Path(cfg.output)
        self.step = 0
        torch.manual_seed(cfg.seed)
        self.model = CausalWan(model_config(cfg)).to(self.device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        if cfg.resume:
            self._resume()
        elif cfg.init:
            self._init_from(Path(cfg.init))
        self.text = wan.HashTextEmbedder(cfg.text_dim, cfg.text_len)
        self.data = None if cfg.data == "synthetic" else VideoFolder(cfg.data, cfg.size)

    def _init_from(self, folder: Path) -> None:
        """Start from another run's weights (the steps, the optimizer and the schedule start anew)."""
        if not (folder / "model.safetensors").is_file():
            raise StreamStudioError(f"--init {folder}: no model.safetensors there (a causal checkpoint folder)")
        saved = json.loads((folder / "config.json").read_text())["causal"]["model"]
        if CausalWanConfig.from_dict(saved) != self.model.cfg:
            raise StreamStudioError(f"--init {folder} holds a model of another shape ({saved}); give its --dim, "
                                    "--layers, --heads and --patch")
        self.model.load_state_dict(load_file(str(folder / "model.safetensors")))

    def _resume(self) -> None:
        state_file = self.out / "trainer_state.json"
        if not state_file.is_file():
            raise StreamStudioError(f"nothing to resume in {self.out}: no trainer_state.json; "
                                    "run without --resume to start a new run")
        saved = json.loads((self.out / "config.json").read_text())["causal"]["model"]
        if CausalWanConfig.from_dict(saved) != self.model.cfg:
            raise StreamStudioError(f"{self.out} holds a model of another shape ({saved}); give its --dim, --layers, "
                                    "--heads and --patch")
        self.model.load_state_dict(load_file(str(self.out / "model.safetensors")))
        self.opt.load_state_dict(torch.load(self.out / "optimizer.pt", weights_only=True))
        self.step = json.loads(state_file.read_text())["step"]

    def loss(self, step: int) -> torch.Tensor:
        """Flow-matching loss of step `step`'s batch, every chunk teacher-forced (the mean over every
        frame made, the `first_chunks` clips' first chunks included)."""
        cfg = self.cfg
        loss = self.clip_loss(cfg, step)
        if not cfg.first_chunks:
            return loss
        # clips of their own: draws seeded apart from the main clips'
        n = first_chunk_of(cfg)
        first = replace(cfg, batch_size=cfg.first_chunks, frames=n, chunk_frames=n, window=n, sink=0,  # (no past)
                        seed=cfg.seed + 10**9)
        n_main, n_first = cfg.batch_size * cfg.frames, cfg.first_chunks * n
        return (loss * n_main + self.clip_loss(first, step) * n_first) / (n_main + n_first)

    def clip_loss(self, cfg: CausalTrainConfig, step: int) -> torch.Tensor:
        """The mean squared velocity error over the noisy frames of `cfg`'s clips of step `step`."""
        dev = self.device
        clips, caps, sigma, noise, context = draw(cfg, self.data, step)
        clean, noise, sigma = clips.to(dev), noise.to(dev), sigma.to(dev)  # (B, F, 3, H, W), (B, F)
        s = sigma[:, :, None, None, None]
        noisy = (1 - s) * clean + s * noise
        text = self.model.embed_text(text_batch(self.text, caps, cfg.text_len).to(dev))
        context = context.to(dev)
        if cfg.self_context and cfg.frames > cfg.chunk_frames:  # (a first chunk alone reads no past)
            context = self.own_context(cfg, step, context, text)
        out = self.model.teacher_forcing(context, noisy, sigma * 1000, text, cfg.chunk_frames,
                                         window_of(cfg), cfg.sink)  # (B, F, 3, H, W)
        return (out - (noise - clean)).pow(2).mean()

    def own_context(self, cfg: CausalTrainConfig, step: int, context: torch.Tensor, text) -> torch.Tensor:
        """`context` (B, F, 3, H, W) with a `self_context` share of the clips replaced by the model's own
        frames: each chunk noised to the sampler's last step's level and predicted back (x0) from the
        data's past, as the sampler's last step makes a chunk; no gradient."""
        gen = torch.Generator().manual_seed((cfg.seed * 1_000_003 + step) * 64 + 1)  # (draw's seed + 1)
        # the prompt's own cross-attention cache for these passes: one filled here, without a graph,
        # would be read by the training call after it, and the text's path would learn nothing
        text = CausalText(text.context)
        b = context.shape[0]
        chosen = (torch.rand(b, generator=gen) < cfg.self_context).to(context.device)  # (B,)
        s = float(cfg.sampling["steps"][-1]) / 1000
        noisy = (1 - s) * context + s * torch.randn(context.shape, generator=gen).to(context.device)
        if cfg.self_rollout:
            return self.rolled_out(cfg, s, context, noisy, text, chosen)
        with torch.no_grad():
            t = torch.full(context.shape[:2], s * 1000, device=context.device)  # (B, F)
            v = self.model.teacher_forcing(context, noisy, t, text, cfg.chunk_frames, window_of(cfg), cfg.sink)
            own = (noisy - s * v).clamp(-1, 1)
        return torch.where(chosen[:, None, None, None, None], own, context)

    def rolled_out(self, cfg: CausalTrainConfig, s: float, context: torch.Tensor, noisy: torch.Tensor, text,
                   chosen: torch.Tensor) -> torch.Tensor:
        """`own_context` chunk by chunk (`self_rollout`): the chosen clips' chunk j predicted back from
        level s reading the model's own chunks before it, as a stream reads what it made, so its errors
        carry on from chunk to chunk; one pass a chunk over the chosen clips (the last chunk is read
        by no noisy chunk, so it stays the data's). No gradient."""
        idx = chosen.nonzero().flatten()  # (b,)
        if not len(idx):  # (a small batch can choose none)
            return context
        past, noisy = context[idx].clone(), noisy[idx]  # (b, F, 3, H, W)
        text = CausalText(text.context[idx])  # (its own cross-attention cache, no gradient)
        c = cfg.chunk_frames
        t = torch.full(past.shape[:2], s * 1000, device=past.device)  # (b, F)
        with torch.no_grad():
            for j in range(past.shape[1] // c - 1):
                v = self.model.teacher_forcing(past, noisy, t, text, c, window_of(cfg), cfg.sink)
                past[:, j * c:(j + 1) * c] = (noisy - s * v)[:, j * c:(j + 1) * c].clamp(-1, 1)
        out = context.clone()
        out[idx] = past
        return out

    def train(self) -> list[float]:
        self.model.train()
        return run_steps(self, Schedule.of(self.cfg, "train-video (causal)"), self.model.parameters(), self.loss)

    def sampling(self) -> dict:
        """The sampling defaults stored with the checkpoint (CausalConfig's fields, height, width)."""
        cfg = self.cfg
        first = {"first_chunk_frames": cfg.first_chunk_frames} if cfg.first_chunk_frames else {}
        return {"chunk_frames": cfg.chunk_frames, "window": window_of(cfg), "sink": cfg.sink, **first, **cfg.sampling,
                "height": cfg.size, "width": cfg.size}

    def save(self, seconds: float = 0.0) -> None:
        cfg = self.cfg
        train = {k: v for k, v in asdict(cfg).items() if k != "sampling"}
        save_causal_checkpoint(self.out, self.model, {"kind": "hash", "dim": cfg.text_dim, "length": cfg.text_len},
                               self.sampling(), extra={"train": train})
        torch.save(self.opt.state_dict(), self.out / "optimizer.pt")
        (self.out / "trainer_state.json").write_text(json.dumps({"step": self.step, "seconds": round(seconds, 1)}))
        log.info("saved step %d to %s", self.step, self.out)
