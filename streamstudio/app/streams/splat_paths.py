"""Splat renders' camera paths as files: authored paths read (nerfstudio camera_path.json,
SuperSplat's animation or project) and written (nerfstudio), for `streamstudio splat` and the
Splats tab alike."""

from __future__ import annotations

from pathlib import Path
import json
import zipfile

from streamstudio.errors import StreamStudioError
from streamstudio.pipelines.splats.splat_render import path_from_json
from streamstudio.pipelines.splats.splat_render import path_to_nerfstudio


def read_path_file(path: str | Path, prefer: str = "frames"):
    """A camera path file: nerfstudio's camera_path.json, SuperSplat's viewer settings / document.json,
    or a SuperSplat project (.ssproj, a zip holding document.json). Bad files raise StreamStudioError."""
    path = Path(path)
    if not path.is_file():
        raise StreamStudioError(f"{path}: no such camera path file")
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                if "document.json" not in z.namelist():
                    raise StreamStudioError(f"{path}: a zip without document.json is not a SuperSplat project")
                data = json.loads(z.read("document.json").decode("utf-8"))
        else:
            data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, zipfile.BadZipFile) as exc:
        raise StreamStudioError(f"{path}: cannot read the camera path ({exc})") from None
    return path_from_json(data, str(path), prefer)

def write_path_file(keyframe_path, target: str | Path, width: int, height: int, fps: float) -> Path:
    """Write a path as nerfstudio's camera_path.json (keyframes and the rendered frames)."""
    target = Path(target)
    try:
        target.write_text(json.dumps(path_to_nerfstudio(keyframe_path, width, height, fps), indent=1))
    except OSError as exc:
        raise StreamStudioError(f"cannot write {target}: {exc.strerror or exc}") from exc
    return target
