"""One way to open a stream (issue 27): every front end (the CLI commands, web sessions, WHIP,
the Splats and Video tabs, batch and Ray jobs) turns its request into a running stream here, and
nothing below app/ is asked twice. `requests` types what a front end asks for, `image` opens image
streams (StreamDiffusion), `video` video streams (StreamDiT, Wan), `run` runs one to its end from
the command line. The commands in `app/cli/` are argument parsers over these (app/cli/requests.py
turns a command line into a request); nothing imports `app/cli/`.

Importing this package imports no torch: each function imports what it needs when it runs."""

from streamstudio.app.streams.image import FittedFrames, acceleration_plan, build_pipeline, output_size  # noqa: F401
from streamstudio.app.streams.requests import Addons, BatchRequest, ImageRequest, ServeRequest  # noqa: F401
from streamstudio.app.streams.run import expected_frames, rtmp_config, watch  # noqa: F401
