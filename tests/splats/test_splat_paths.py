"""Authored camera paths: nerfstudio's camera_path.json and SuperSplat's animation, their axes, the
smooth interpolation (Catmull-Rom positions, squad rotations), and `splat --path-file`."""

from __future__ import annotations

import json
import math
import zipfile

import numpy as np
import pytest
import torch

from streamstudio.app.cli import main
from streamstudio.app.streams.splat_paths import read_path_file, write_path_file
from streamstudio.errors import StreamStudioError
from streamstudio.models.splats.gaussians import GaussianScene, save_scene
from streamstudio.pipelines.splats.splat_render import (Keyframe, KeyframePath, SplatRenderConfig, hermite,
                                                        path_from_json, quat_to_rotation, render_frame,
                                                        rotation_to_quat, slerp, squad_path)

SH_C0 = 0.28209479177387814


def dot_scene(pos, scale=0.03) -> GaussianScene:
    """One small, opaque white Gaussian at `pos`."""
    return GaussianScene(means=torch.tensor([pos], dtype=torch.float32), quats=torch.tensor([[1.0, 0, 0, 0]]),
                         log_scales=torch.full((1, 3), math.log(scale)), opacity_logits=torch.tensor([6.0]),
                         sh=torch.full((1, 1, 3), 0.5 / SH_C0))


def centroid(frame: np.ndarray) -> tuple[float, float]:
    """Intensity-weighted centre (u, v) of a frame, in pixel-centre coordinates (u + 0.5)."""
    w = frame[..., 0].astype(np.float64)
    assert w.sum() > 0, "the Gaussian is not in view"
    v, u = np.mgrid[0:frame.shape[0], 0:frame.shape[1]]
    return float((w * (u + 0.5)).sum() / w.sum()), float((w * (v + 0.5)).sum() / w.sum())


def gl_matrix(rot_cols, eye) -> list[float]:
    """Row-major 4x4 camera-to-world with OpenGL camera axes: columns right, up, back, position."""
    m = np.eye(4)
    m[:3, :3] = np.stack(rot_cols, 1)
    m[:3, 3] = eye
    return m.reshape(-1).tolist()


def render_path_frame(scene, path: KeyframePath, width, height, fps, index=0):
    cam, _ = path.cameras(width, height, fps)[index]
    return render_frame(scene, cam, SplatRenderConfig(width=width, height=height, sh_degree=0, impl="fast"))


# --------------------------------------------------------------------------- nerfstudio


def nerfstudio_doc(frames, fov=40.0, width=64, height=48, fps=10.0):
    return {"camera_type": "perspective", "render_width": width, "render_height": height, "fps": fps,
            "seconds": len(frames) / fps, "is_cycle": False, "smoothness_value": 0.5, "default_fov": fov,
            "camera_path": [{"camera_to_world": m, "fov": fov, "aspect": width / height} for m in frames],
            "keyframes": [{"matrix": m, "fov": fov, "aspect": width / height} for m in frames]}


@pytest.mark.parametrize("case", ["identity", "turned"])
def test_nerfstudio_opengl_camera_sees_a_gaussian_at_the_expected_pixel(case):
    """camera_to_world has OpenGL axes (x right, y up, z back); a point above the view axis must
    land above the image centre, one to the camera's right to its right."""
    width, height, fov = 64, 48, 40.0
    f = 0.5 * height / math.tan(math.radians(fov) / 2)  # nerfstudio's focal from its vertical fov
    if case == "identity":  # at (0, 0, 5), looking down world -z
        m = gl_matrix([(1, 0, 0), (0, 1, 0), (0, 0, 1)], (0, 0, 5))
        point, cam_xyz = (1.0, 0.5, 0.0), (1.0, 0.5, -5.0)
    else:  # at (5, 0, 0), looking down world -x: right = -z, up = +y, back = +x
        m = gl_matrix([(0, 0, -1), (0, 1, 0), (1, 0, 0)], (5, 0, 0))
        point, cam_xyz = (0.0, 0.5, 1.0), (-1.0, 0.5, -5.0)
    x, y, z = cam_xyz  # the point in the OpenGL camera's frame, written out by hand
    expected = (width / 2 + f * x / -z, height / 2 - f * y / -z)
    path = path_from_json(nerfstudio_doc([m, m]))
    u, v = centroid(render_path_frame(dot_scene(point), path, width, height, 10.0))
    assert abs(u - expected[0]) < 0.2 and abs(v - expected[1]) < 0.2, ((u, v), expected)


def test_nerfstudio_frames_come_back_exactly_at_the_files_fps():
    rng = np.random.default_rng(0)
    frames = []
    for i in range(5):
        q = rng.normal(size=4)
        rot = quat_to_rotation(q / np.linalg.norm(q))
        frames.append(gl_matrix(list(rot.T), rng.normal(size=3)))
    path = path_from_json(nerfstudio_doc(frames, fps=10.0))
    assert path.fps == 10.0 and path.width == 64 and path.height == 48 and path.duration == pytest.approx(0.5)
    times = path.frame_times(10.0)
    assert len(times) == 5
    for t, m in zip(times, frames):
        c2w, fov, _ = path.sample(t)
        gl = c2w @ np.diag([1.0, -1.0, -1.0, 1.0])
        np.testing.assert_allclose(gl.reshape(-1), m, atol=1e-9)
        assert fov == pytest.approx(40.0)


def test_nerfstudio_round_trip_of_keyframes(tmp_path):
    keys = [Keyframe(np.linalg.inv(_look(eye, (0, 0, 0))), 30.0 + 5 * i, float(i))
            for i, eye in enumerate([(0, 0, -4), (3, -1, -3), (4, 0, 1)])]
    path = KeyframePath(keys)
    out = write_path_file(path, tmp_path / "camera_path.json", 80, 60, 12.0)
    doc = json.loads(out.read_text())
    assert {"keyframes", "camera_path", "render_width", "render_height", "fps", "seconds", "is_cycle"} <= set(doc)
    assert doc["render_width"] == 80 and doc["fps"] == 12.0 and doc["seconds"] == pytest.approx(2.0)
    assert len(doc["camera_path"]) == 24 and len(doc["keyframes"]) == 3
    back = read_path_file(out, prefer="keyframes")
    assert len(back.keyframes) == 3
    for a, b in zip(keys, back.keyframes):
        np.testing.assert_allclose(a.c2w, b.c2w, atol=1e-12)
        assert a.fov_y_deg == b.fov_y_deg and a.time == pytest.approx(b.time)
    frames = read_path_file(out)  # the rendered frames: the same cameras as the path at 12 fps
    for t_ours, t_file in zip(path.frame_times(12.0), frames.frame_times(12.0)):
        np.testing.assert_allclose(path.sample(t_ours)[0], frames.sample(t_file)[0], atol=1e-9)


def _look(eye, target):
    from streamstudio.pipelines.splats.splat_render import Camera
    return Camera.look_at(eye, target, 8, 8).viewmat.double().numpy()


# --------------------------------------------------------------------------- interpolation


def test_hermite_is_catmull_rom_and_eases_at_smoothness_zero():
    times = np.array([0.0, 1.0, 3.0, 4.0])
    vals = np.array([[0.0], [1.0], [5.0], [2.0]])
    for i, t in enumerate(times):
        assert hermite(times, vals, t)[0] == pytest.approx(vals[i, 0])
    # segment 1..3 (h = 2), tangents m1 = (5 - 0) / 3, m2 = (2 - 1) / 3, scaled by h, written out
    s = 0.25
    m1, m2 = 5 / 3 * 2, 1 / 3 * 2
    expected = ((2 * s**3 - 3 * s**2 + 1) * 1 + (s**3 - 2 * s**2 + s) * m1 + (-2 * s**3 + 3 * s**2) * 5
                + (s**3 - s**2) * m2)
    assert hermite(times, vals, 1.5)[0] == pytest.approx(expected)
    # smoothness 0: zero tangents, easing in and out of every key (SuperSplat's slider at 0)
    assert hermite(times, vals, 1.5, smoothness=0.0)[0] == pytest.approx(1 + 4 * (3 * s**2 - 2 * s**3))
    assert hermite(times, vals, -1.0)[0] == 0.0 and hermite(times, vals, 9.0)[0] == 2.0  # clamped
    # smooth: the slope just left and right of a key agree
    e = 1e-6
    left = (hermite(times, vals, 1.0)[0] - hermite(times, vals, 1.0 - e)[0]) / e
    right = (hermite(times, vals, 1.0 + e)[0] - hermite(times, vals, 1.0)[0]) / e
    assert left == pytest.approx(right, rel=1e-4)


def test_hermite_loop_wraps_its_tangents():
    times = np.array([0.0, 1.0, 2.0, 3.0])
    vals = np.array([[0.0], [1.0], [0.0], [-1.0]])
    period = 4.0
    assert hermite(times, vals, 4.0 - 1e-12, period=period)[0] == pytest.approx(0.0, abs=1e-9)
    assert (hermite(times, vals, 0.5, period=period)[0]
            == pytest.approx(hermite(times, vals, 0.5 + 4.0 * 0, period=period)[0]))
    e = 1e-6  # smooth through the closing key: slope at 0 from the wrap side equals slope after it
    right = (hermite(times, vals, e, period=period)[0] - hermite(times, vals, 0.0, period=period)[0]) / e
    assert right == pytest.approx((1.0 - (-1.0)) / 2.0, rel=1e-4)


def test_squad_hits_keys_matches_slerp_for_two_keys_and_stays_a_rotation():
    rng = np.random.default_rng(1)
    qs = rng.normal(size=(4, 4))
    qs /= np.linalg.norm(qs, axis=1, keepdims=True)
    times = np.array([0.0, 1.0, 2.0, 4.0])
    for i in range(4):
        q = squad_path(times, qs, times[i])
        assert min(np.linalg.norm(q - qs[i]), np.linalg.norm(q + qs[i])) < 1e-9
    a, b = qs[0], qs[1] if np.dot(qs[0], qs[1]) >= 0 else -qs[1]
    np.testing.assert_allclose(squad_path(times[:2], np.stack([a, b]), 0.3), slerp(a, b, 0.3), atol=1e-12)
    for t in np.linspace(0, 4, 17):
        r = quat_to_rotation(squad_path(times, qs, t))
        np.testing.assert_allclose(r @ r.T, np.eye(3), atol=1e-12)
    # smooth: the angular velocity just before and after an inner key agree
    def ang(t0, t1):
        q0, q1 = squad_path(times, qs, t0), squad_path(times, qs, t1)
        return 2 * math.acos(min(1.0, abs(float(np.dot(q0, q1))))) / (t1 - t0)
    assert ang(1 - 1e-5, 1) == pytest.approx(ang(1, 1 + 1e-5), rel=1e-2)


def test_rotation_quaternion_round_trip():
    rng = np.random.default_rng(2)
    for _ in range(20):
        q = rng.normal(size=4)
        q /= np.linalg.norm(q)
        back = rotation_to_quat(quat_to_rotation(q))
        assert min(np.linalg.norm(back - q), np.linalg.norm(back + q)) < 1e-12


# --------------------------------------------------------------------------- SuperSplat


def supersplat_settings(positions, targets, fovs, frames, rate=30.0, duration=None, loop="none"):
    return {"version": 2, "animTracks": [{
        "name": "cameraAnim", "duration": duration if duration is not None else (frames[-1] + 1) / rate,
        "frameRate": rate, "loopMode": loop, "interpolation": "spline", "smoothness": 1,
        "keyframes": {"times": frames, "values": {"position": sum(map(list, positions), []),
                                                   "target": sum(map(list, targets), []), "fov": fovs}}}],
        "cameras": [], "annotations": [], "startMode": "animTrack"}


def test_supersplat_animation_sees_a_gaussian_at_the_expected_pixel():
    """SuperSplat's world is the file's turned 180 degrees about z (y up, camera looking down -z);
    its fov spans the longer side of a wide view."""
    width, height, fov = 64, 32, 60.0
    doc = supersplat_settings([(0, 0, 5), (0, 0, 5)], [(0, 0, 0), (0, 0, 0)], [fov, fov], [0, 30])
    path = path_from_json(doc)
    f = 0.5 * width / math.tan(math.radians(fov) / 2)  # horizontal fov on a wide view
    # engine point (-1, 0.5, 0) is left of and above the view axis; in the file it is (1, -0.5, 0)
    expected = (width / 2 - f * 1 / 5, height / 2 - f * 0.5 / 5)
    u, v = centroid(render_path_frame(dot_scene((1.0, -0.5, 0.0)), path, width, height, 30.0))
    assert abs(u - expected[0]) < 0.2 and abs(v - expected[1]) < 0.2, ((u, v), expected)


def test_supersplat_timing_follows_frames_and_frame_rate():
    doc = supersplat_settings([(0, 0, 5), (5, 0, 0), (0, 0, -5)], [(0, 0, 0)] * 3, [50, 50, 70], [0, 15, 60],
                              rate=30.0, duration=3.0)
    path = path_from_json(doc)
    assert path.duration == 3.0 and path.fps == 30.0 and len(path.frame_times(30.0)) == 90
    c2w, fov, _ = path.sample(0.5)  # frame 15: the second key, at engine (5, 0, 0) -> file (-5, 0, 0)
    np.testing.assert_allclose(c2w[:3, 3], (-5, 0, 0), atol=1e-12)
    assert fov == pytest.approx(50.0)
    np.testing.assert_allclose(c2w[:3, 2], (1, 0, 0), atol=1e-12)  # looking at the origin
    assert path.sample(2.0)[1] == pytest.approx(70.0)  # past the last key: held


def test_supersplat_project_file_loads(tmp_path):
    doc = {"camera": {"fov": 55}, "timeline": {"frames": 60, "frameRate": 24, "smoothness": 1, "loop": False},
           "poseSets": [{"name": "set0", "poses": [
               {"name": "camera_0", "frame": 0, "position": [0, 0, 4], "target": [0, 0, 0], "fov": 55},
               {"name": "camera_1", "frame": 30, "position": [4, 0, 0], "target": [0, 0, 0]},
               {"name": "camera_2", "frame": 90, "position": [0, 0, -4], "target": [0, 0, 0]}]}]}
    proj = tmp_path / "scene.ssproj"
    with zipfile.ZipFile(proj, "w") as z:
        z.writestr("document.json", json.dumps(doc))
    path = read_path_file(proj)
    assert len(path.keyframes) == 2 and path.duration == pytest.approx(2.5)  # the key past frame 60 is dropped
    assert path.keyframes[1].time == pytest.approx(30 / 24) and path.keyframes[1].fov_y_deg == 55


# --------------------------------------------------------------------------- CLI and errors


def test_cli_renders_a_nerfstudio_path(tmp_path, capsys):
    scene = tmp_path / "dot.ply"
    save_scene(dot_scene((1.0, 0.5, 0.0), scale=0.05), scene)
    m = gl_matrix([(1, 0, 0), (0, 1, 0), (0, 0, 1)], (0, 0, 5))
    m2 = gl_matrix([(1, 0, 0), (0, 1, 0), (0, 0, 1)], (0.5, 0, 5))
    doc = nerfstudio_doc([m, m2, m2, m2], width=64, height=48, fps=4.0)
    (tmp_path / "path.json").write_text(json.dumps(doc))
    out = tmp_path / "frames"
    assert main(["splat", str(scene), "--path-file", str(tmp_path / "path.json"), "--fps", "8",
                 "--sh-degree", "0", "--output", str(out)]) == 0
    pngs = sorted(out.glob("*.png"))
    assert len(pngs) == 8  # one second of path at 8 fps, at the file's 64x48
    from PIL import Image
    first = np.asarray(Image.open(pngs[0]))
    assert first.shape == (48, 64, 3)
    f = 0.5 * 48 / math.tan(math.radians(40) / 2)
    u, v = centroid(first)
    assert abs(u - (32 + f / 5)) < 0.3 and abs(v - (24 - f * 0.5 / 5)) < 0.3
    video = tmp_path / "fly.mp4"
    assert main(["splat", str(scene), "--path-file", str(tmp_path / "path.json"), "--fps", "30", "--size", "32x24",
                 "--output", str(video)]) == 0
    assert video.stat().st_size > 0 and "wrote 30 frames" in capsys.readouterr().out


@pytest.mark.parametrize("content, message", [
    ("not json", "cannot read"),
    ("[1, 2]", "not a camera path"),
    ('{"foo": 1}', "not a camera path"),
    ('{"camera_path": [], "keyframes": []}', "no camera_path frames"),
    ('{"camera_path": [{"camera_to_world": [1, 2, 3]}], "seconds": 1}', "malformed"),
    ('{"animTracks": []}', "animTracks is empty"),
    ('{"camera_type": "equirectangular", "camera_path": [{"camera_to_world": [1,0,0,0,0,1,0,0,0,0,1,0,0,0,0,1], '
     '"fov": 50}], "seconds": 1}', "not supported"),
])
def test_bad_path_files_fail_clearly(tmp_path, content, message):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    with pytest.raises(StreamStudioError, match=message):
        read_path_file(bad).check()


def test_a_path_with_a_bad_matrix_fails_clearly():
    path = KeyframePath([Keyframe(np.diag([2.0, 1, 1, 1]))])
    with pytest.raises(StreamStudioError, match="not a rotation"):
        path.sample(0.0)
