"""The training commands' configs (`train-image`, `train-video`): plain dataclasses, importing
nothing heavy, so the commands' flags and help are built without torch (the trainers are in
`app/training/image.py` and `app/training/video.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field

STAGES = ("joint", "all", "vae", "denoiser")


@dataclass
class ImageTrainConfig:
    output: str = "runs/image_builtin"
    stage: str = "joint"  # joint | all (vae, then denoiser) | vae | denoiser
    vae_steps: int = 3000
    vae_batch_size: int = 16
    vae_size: int = 64  # autoencoder training crops (pixels)
    vae_lr: float = 2e-3
    steps: int = 4000  # denoiser steps
    batch_size: int = 16
    size: int = 96  # denoiser and joint training crops (pixels)
    lr: float = 1e-3
    warmup: int = 100
    min_lr_ratio: float = 0.05
    grad_clip: float = 1.0
    pixel_weight: float = 1.0  # the denoiser's pixel-space L1 through the frozen decoder
    default_share: float = 0.5  # share of denoiser samples at the default strength's t
    txt2img_share: float = 0.15  # share at txt2img's t
    # denoiser prompts naming a style: image_data.DEFAULT_STYLE_SHARE (a test keeps them equal)
    style_share: float = 0.38
    photos: str = ""  # a folder holding the unpacked photograph packages (photo_data.fetch); "" = procedural only
    photo_share: float = 0.75  # share of each batch cut from the photographs (the rest procedural)
    landscape_share: float = 0.125  # share of landscape layouts under prompts naming one (txt2img's sky over ground)
    ae_warmup: int = 500  # joint stage: its first steps train the autoencoder alone (noisy latents), then all
    ae_weight: float = 0.5  # joint stage: the weight of the autoencoder's own reconstruction (no noise)
    latent_weight: float = 0.5  # joint stage: MSE of x0 to the look's latents (encode of the target)
    txt2img_weight: float = 0.3  # joint stage: the weight of txt2img's samples (their x0 is the look's mean)
    init: str = ""  # start from this model folder (e.g. the shipped one): its autoencoder and denoiser
    latent_channels: int = 0  # with init: widen the model's latents to this many channels (a multiple; 0 keeps them)
    layout_size: int = 0  # joint stage: also one txt2img landscape a step at this size (the pipeline's 256; 0: none)
    layout_weight: float = 0.3  # the layout term's weight (as txt2img's samples in the batch)
    prediction: str = ""  # what the UNet predicts: epsilon or v_prediction ("": the resumed run's or --init's)
    # joint stage: weight of 1 - correlation of the Sobel edge maps of x0's picture and the look
    edge_weight: float = 0.0
    seed: int = 0
    save_every: int = 200
    resume: bool = False
    cpu: bool = False
    max_minutes: float = 0.0  # stop and save after this wall time (0: no limit)
    progress: bool = True


@dataclass
class VideoTrainConfig:
    output: str = "runs/stream_dit"
    model: str = "tiny"  # a named StreamDiT config
    data: str = "synthetic"  # "synthetic" or a folder of videos
    mode: str = "flow"  # "flow" (buffered flow matching) or "distill"
    teacher: str | None = None  # checkpoint folder of the teacher (distill mode)
    teacher_steps: int = 4  # the teacher's micro-steps per chunk (distill mode)
    distill_startup_share: float = 0.25  # share of distillation buffers from the start-up's uniform generation
    init: str | None = None  # start (flow mode) from the weights of this checkpoint folder, new optimizer
    init_shift_mask: bool = True  # with init: turn the masked window shift on (False keeps the checkpoint's)
    cond_drop: float = 0.0  # share of captions replaced by "" (flow mode), for classifier-free guidance
    context_fade: float = 0.0  # flow mode: share of buffers whose oldest chunks are faded (training.video.context_fade)
    teacher_guidance: float = 1.0  # distill mode: the teacher's classifier-free guidance, distilled into the student
    steps: int = 1000
    batch_size: int = 8
    buffer_frames: int = 8  # B = N * c frames that are denoised
    ref_frames: int = 0  # K clean reference frames before the buffer
    size: int = 32  # frame side in pixels (latent side for the tiny pixel-space model)
    lr: float = 5e-4
    warmup: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    save_every: int = 250
    resume: bool = False  # continue from the checkpoint in `output`
    cpu: bool = False
    max_minutes: float = 0.0  # stop (and save) after this much wall time; 0 = no limit
    progress: bool = True
    workers: int = 0  # flow mode: processes that draw the batches ahead of the loop (0: the loop draws them)
    sampling: dict = field(default_factory=lambda: {"num_chunks": 4, "chunk_size": 2, "micro_steps": 2})


@dataclass
class CausalTrainConfig:
    """`train-video --causal`: the block-causal Wan (models/video/causal_wan.py) trained with flow
    matching and teacher forcing (app/training/causal.py)."""

    output: str = "runs/causal_tiny"
    data: str = "synthetic"  # "synthetic" or a folder of videos
    dim: int = 128  # the CausalWan's hidden size
    ffn_dim: int = 512
    layers: int = 4
    heads: int = 4
    patch: int = 4  # pixels a token's side (32x32 frames: 64 tokens a frame)
    text_dim: int = 32  # the hash text encoder's width (wan.HashTextEmbedder)
    text_len: int = 8  # words of a prompt the model reads
    steps: int = 1000
    batch_size: int = 8
    frames: int = 8  # frames of a training clip (whole chunks)
    chunk_frames: int = 2
    window: int = 0  # frames the training's attention and the sampler's cache hold (0: the clip's)
    sink: int = 0  # first frames never dropped from the window
    context_noise: float = 0.0  # the clean frames the chunks read carry noise up to this sigma (labelled t = 0)
    cond_drop: float = 0.0  # a share of the clips trained with the empty prompt (for guidance)
    first_chunks: int = 0  # more clips a step, trained as a stream's first chunk alone (no past to read)
    first_chunk_frames: int = 0  # those clips' frames, the sampler's first chunk (0: chunk_frames)
    self_context: float = 0.0  # a share of the clips read the model's own frames: its x0 at the last step's level
    self_rollout: bool = False  # with self_context: those frames made chunk by chunk, each reading its own before it
    init: str = ""  # start from this causal checkpoint folder's weights (a fine-tune; not --resume's state)
    size: int = 32  # frame side in pixels
    lr: float = 1e-3
    warmup: int = 50
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    save_every: int = 50
    resume: bool = False
    cpu: bool = False
    max_minutes: float = 0.0  # stop (and save) after this much wall time; 0 = no limit
    progress: bool = True
    # sampling defaults stored with the checkpoint (pipelines/video/causal_video.py CausalConfig)
    sampling: dict = field(default_factory=lambda: {"steps": [1000.0, 750.0, 500.0, 250.0], "warp": False,
                                                    "shift": 1.0, "context_t": 0.0})
