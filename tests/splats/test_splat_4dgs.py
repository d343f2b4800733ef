"""Checkpoints of fudan-zvg/4d-gaussian-splatting read as StreamStudio 4D scenes.

The expected values come from that code's own lines, written out below in its names
(`build_rotation_4d`, `build_scaling_rotation_4d`, `build_covariance_from_scaling_rotation_4d`,
`get_cov_t`, `get_marginal_t` of scene/gaussian_model.py and utils/general_utils.py at its
main branch), applied to the raw checkpoint tensors; our side is `load_scene` then
`slice_4d`, so every convention (its flipped 4D rotation, its time variance) is checked."""

from __future__ import annotations

import pytest
import torch

from streamstudio.errors import StreamStudioError
from streamstudio.models.splats.gaussians import load_scene, rotation_4d, slice_4d
from streamstudio.models.splats.gaussians_4dgs import isoclinic_quaternions, read_4dgs_checkpoint

N = 64


# ------------------------------------------------------------------ the reference code's lines
def build_rotation_4d(left, right):
    l_norm = torch.norm(left, dim=-1, keepdim=True)
    r_norm = torch.norm(right, dim=-1, keepdim=True)
    q_l = left / l_norm
    q_r = right / r_norm
    a, b, c, d = q_l.unbind(-1)
    p, q, r, s = q_r.unbind(-1)
    M_l = torch.stack([a, -b, -c, -d,
                       b, a, -d, c,
                       c, d, a, -b,
                       d, -c, b, a]).view(4, 4, -1).permute(2, 0, 1)
    M_r = torch.stack([p, q, r, s,
                       -q, p, -s, r,
                       -r, s, p, -q,
                       -s, -r, q, p]).view(4, 4, -1).permute(2, 0, 1)
    A = M_l @ M_r
    A = A.flip(1, 2)
    return A


def build_scaling_rotation_4d(s, left, right):
    L = torch.zeros((s.shape[0], 4, 4), dtype=torch.float64)
    R = build_rotation_4d(left, right)
    L[:, 0, 0] = s[:, 0]
    L[:, 1, 1] = s[:, 1]
    L[:, 2, 2] = s[:, 2]
    L[:, 3, 3] = s[:, 3]
    L = R @ L
    return L


def build_covariance_from_scaling_rotation_4d(scaling, scaling_modifier, rotation_l, rotation_r, dt=0.0):
    L = build_scaling_rotation_4d(scaling_modifier * scaling, rotation_l, rotation_r)
    actual_covariance = L @ L.transpose(1, 2)
    cov_11 = actual_covariance[:, :3, :3]
    cov_12 = actual_covariance[:, 0:3, 3:4]
    cov_t = actual_covariance[:, 3:4, 3:4]
    current_covariance = cov_11 - cov_12 @ cov_12.transpose(1, 2) / cov_t
    mean_offset = cov_12.squeeze(-1) / cov_t.squeeze(-1) * dt
    return current_covariance, mean_offset.squeeze(-1)


def build_rotation(r):  # utils/general_utils.py (3DGS)
    norm = torch.sqrt(r[:, 0] * r[:, 0] + r[:, 1] * r[:, 1] + r[:, 2] * r[:, 2] + r[:, 3] * r[:, 3])
    q = r / norm[:, None]
    R = torch.zeros((q.size(0), 3, 3), dtype=torch.float64)
    r, x, y, z = q[:, 0], q[:, 1], q[:, 2], q[:, 3]
    R[:, 0, 0] = 1 - 2 * (y * y + z * z)
    R[:, 0, 1] = 2 * (x * y - r * z)
    R[:, 0, 2] = 2 * (x * z + r * y)
    R[:, 1, 0] = 2 * (x * y + r * z)
    R[:, 1, 1] = 1 - 2 * (x * x + z * z)
    R[:, 1, 2] = 2 * (y * z - r * x)
    R[:, 2, 0] = 2 * (x * z - r * y)
    R[:, 2, 1] = 2 * (y * z + r * x)
    R[:, 2, 2] = 1 - 2 * (x * x + y * y)
    return R


class Model:
    """The checkpoint's tensors and what the reference code computes from them at time t."""

    def __init__(self, rot_4d: bool, seed: int = 0, sh_degree: int = 3, sh_degree_t: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.rot_4d, self.sh_degree, self.sh_degree_t = rot_4d, sh_degree, sh_degree_t
        self._xyz = torch.randn(N, 3, generator=g, dtype=torch.float64)
        self._scaling = torch.randn(N, 3, generator=g, dtype=torch.float64) * 0.3 - 2.0
        self._rotation = torch.randn(N, 4, generator=g, dtype=torch.float64)
        self._opacity = torch.randn(N, 1, generator=g, dtype=torch.float64)
        self._t = torch.rand(N, 1, generator=g, dtype=torch.float64) - 0.5
        self._scaling_t = torch.randn(N, 1, generator=g, dtype=torch.float64) * 0.3 - 1.5
        self._rotation_r = torch.randn(N, 4, generator=g, dtype=torch.float64)
        channels = (sh_degree + 1) ** 2 * (sh_degree_t + 1)
        features = torch.randn(N, channels, 3, generator=g, dtype=torch.float64)
        self._features_dc, self._features_rest = features[:, :1], features[:, 1:]

    def capture(self):  # scene/gaussian_model.py, gaussian_dim == 4 (optimizer state: a plain dict)
        return (self.sh_degree, self._xyz, self._features_dc, self._features_rest, self._scaling, self._rotation,
                self._opacity, torch.zeros(N), torch.zeros(N, 1), torch.zeros(N, 1), torch.zeros(N, 1),
                {"state": {}, "param_groups": [{"lr": 0.001, "params": [0]}]}, 1.0,
                self._t, self._scaling_t, self._rotation_r, self.rot_4d, torch.empty(0), self.sh_degree_t)

    def save(self, path):
        torch.save((self.capture(), 30000), path)  # train.py
        return path

    def get_cov_t(self):
        if self.rot_4d:
            L = build_scaling_rotation_4d(torch.exp(torch.cat([self._scaling, self._scaling_t], 1)),
                                          self._rotation, self._rotation_r)
            return (L @ L.transpose(1, 2))[:, 3, 3].unsqueeze(1)
        return torch.exp(self._scaling_t)

    def at(self, timestamp: float):
        """(means, 3D covariances, opacities) the renderer gets at `timestamp`."""
        marginal = torch.exp(-0.5 * (self._t - timestamp) ** 2 / self.get_cov_t())  # get_marginal_t
        opacity = torch.sigmoid(self._opacity) * marginal
        if self.rot_4d:
            cov, offset = build_covariance_from_scaling_rotation_4d(
                torch.exp(torch.cat([self._scaling, self._scaling_t], 1)), 1.0, self._rotation, self._rotation_r,
                dt=timestamp - self._t)
            return self._xyz + offset, cov, opacity[:, 0]
        m = build_rotation(self._rotation) @ torch.diag_embed(torch.exp(self._scaling))  # 3DGS's R S
        return self._xyz, m @ m.transpose(1, 2), opacity[:, 0]


@pytest.mark.parametrize("rot_4d", [True, False])
def test_a_checkpoint_slices_as_the_reference_code_renders_it(tmp_path, rot_4d):
    model = Model(rot_4d)
    scene = load_scene(model.save(tmp_path / "chkpnt_best.pth"))
    assert scene.is_4d and len(scene) == N and scene.sh_degree == 3
    for t in (-0.4, 0.0, 0.13, 0.5):
        means, covs, opacity = model.at(t)
        sliced = slice_4d(scene.__class__(**{**scene._fields(), "means": scene.means.double(),
                                             "quats": scene.quats.double(), "log_scales": scene.log_scales.double(),
                                             "t_centers": scene.t_centers.double(),
                                             "t_log_scales": scene.t_log_scales.double(),
                                             "quats_r": scene.quats_r.double(),
                                             "opacity_logits": scene.opacity_logits.double()}), t, min_weight=0.0)
        torch.testing.assert_close(sliced.opacities(), opacity, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(sliced.means, means, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(sliced.covars, covs, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(scene.sh.double(), torch.cat([model._features_dc, model._features_rest], 1),
                               rtol=1e-6, atol=1e-6)


def test_the_issues_measured_sign_conversion_holds():
    """For unit quaternions the decomposition is the conversion measured in the issue:
    rotation -> (w, -x, y, -z), rotation_r -> (w, x, -y, -z) (up to the sign of both)."""
    g = torch.Generator().manual_seed(3)
    left = torch.nn.functional.normalize(torch.randn(16, 4, generator=g, dtype=torch.float64), dim=-1)
    right = torch.nn.functional.normalize(torch.randn(16, 4, generator=g, dtype=torch.float64), dim=-1)
    ours_l, ours_r = isoclinic_quaternions(build_rotation_4d(left, right))
    want_l, want_r = (left * torch.tensor([1.0, -1, 1, -1], dtype=left.dtype),
                      right * torch.tensor([1.0, 1, -1, -1], dtype=left.dtype))
    sign = torch.sign((ours_l * want_l).sum(-1, keepdim=True))
    torch.testing.assert_close(ours_l, want_l * sign)
    torch.testing.assert_close(ours_r, want_r * sign)
    torch.testing.assert_close(rotation_4d(ours_l, ours_r), build_rotation_4d(left, right))


def test_time_dependent_colour_is_dropped_and_said(tmp_path, caplog):
    model = Model(True, sh_degree=3, sh_degree_t=1)
    scene, notes = read_4dgs_checkpoint(model.save(tmp_path / "c.pth"))
    assert scene.sh.shape == (N, 16, 3)
    assert notes and "16 coefficient(s) per channel are dropped" in notes[0] and "c.pth" in caplog.text


def test_convert_writes_a_4d_ply_that_renders_the_same(tmp_path):
    from streamstudio.app.cli import main

    ckpt = Model(True).save(tmp_path / "chkpnt.pth")
    assert main(["splat", "convert", str(ckpt), str(tmp_path / "scene.ply")]) == 0
    back = load_scene(tmp_path / "scene.ply")
    scene = load_scene(ckpt)
    assert back.is_4d
    for name in ("means", "log_scales", "opacity_logits", "t_centers", "t_log_scales", "sh"):
        torch.testing.assert_close(getattr(back, name), getattr(scene, name))
    a, b = slice_4d(back, 0.1, min_weight=0.0), slice_4d(scene, 0.1, min_weight=0.0)
    torch.testing.assert_close(a.covars, b.covars, rtol=1e-4, atol=1e-6)


def test_nothing_but_tensors_is_unpickled(tmp_path):
    class Payload:
        def __reduce__(self):
            return (print, ("unpickled!",))

    bad = tmp_path / "evil.pth"
    torch.save((Payload(), 1), bad)
    with pytest.raises(StreamStudioError, match="not loaded"):
        load_scene(bad)
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"not a checkpoint at all")
    with pytest.raises(StreamStudioError, match="not a readable torch checkpoint"):
        load_scene(junk)
    other = tmp_path / "other.pth"
    torch.save({"weights": torch.zeros(3)}, other)
    with pytest.raises(StreamStudioError, match="not a checkpoint of fudan-zvg"):
        load_scene(other)
    three_d = tmp_path / "3d.pth"
    torch.save((tuple(range(12)), 1), three_d)
    with pytest.raises(StreamStudioError, match="3D checkpoint"):
        load_scene(three_d)
