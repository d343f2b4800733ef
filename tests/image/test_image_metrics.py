"""The image measures (models/image/image_metrics.py) against independent implementations:
scipy's Sobel filter and scikit-image's PSNR, and what the measures must say of known cases."""

from __future__ import annotations

import numpy as np
import pytest

from streamstudio.models.image import image_metrics as m


def _picture(seed: int = 0, size: int = 64) -> np.ndarray:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size]
    img = np.zeros((size, size, 3))
    for _ in range(6):  # a few discs and bars of random colours
        cy, cx, r = rng.integers(0, size, 2).tolist() + [int(rng.integers(4, size // 3))]
        mask = (yy - cy) ** 2 + (xx - cx) ** 2 < r * r if rng.random() < 0.5 else (abs(yy - cy) < r // 2) & (xx > cx)
        img[mask] = rng.random(3) * 255
    return img.astype(np.uint8)


def test_sobel_is_scipys():
    from scipy import ndimage

    y = m.luma(_picture())
    expected = np.hypot(ndimage.sobel(y, axis=1, mode="nearest"), ndimage.sobel(y, axis=0, mode="nearest"))
    np.testing.assert_allclose(m.sobel(y), expected, atol=1e-12)


def test_psnr_is_scikit_images():
    from skimage.metrics import peak_signal_noise_ratio

    a, b = _picture(0), _picture(1)
    assert m.psnr(a, b) == pytest.approx(peak_signal_noise_ratio(a, b, data_range=255), rel=1e-9)
    assert m.psnr(a, a) == float("inf")


def test_edge_correlation_ranks_what_keeps_edges():
    img = _picture(2, 128)
    assert m.edge_correlation(img, img) == pytest.approx(1.0)
    mild, strong = m.gaussian_blur(img, 1.0), m.gaussian_blur(img, 4.0)
    assert 1.0 > m.edge_correlation(img, mild) > m.edge_correlation(img, strong) > 0.2
    assert abs(m.edge_correlation(img, _picture(3, 128))) < 0.2  # unrelated pictures
    assert m.edge_correlation(img, strong, block=4) > m.edge_correlation(img, strong)  # coarse edges survive a blur


def test_colour_measures():
    red = np.zeros((8, 8, 3), np.uint8)
    red[..., 0] = 255
    grey = np.full((8, 8, 3), 128, np.uint8)
    assert m.redness(red) == pytest.approx(1.0) and m.blueness(red) == pytest.approx(-0.5)
    assert m.saturation(grey) == 0 and m.saturation(red) == pytest.approx(1.0)
    assert m.mean_abs(red, red) == 0 and m.ssim(grey, grey) == pytest.approx(1.0)


def test_baselines_keep_size_and_flat_pictures():
    grey = np.full((32, 48, 3), 77, np.uint8)
    assert np.array_equal(m.bicubic_down_up(grey, 4), grey)
    assert np.array_equal(m.gaussian_blur(grey, 4.0), grey)
    img = _picture(4, 64)
    assert m.bicubic_down_up(img, 4).shape == img.shape
    assert m.psnr(m.bicubic_down_up(img, 2), img) > m.psnr(m.bicubic_down_up(img, 8), img)
