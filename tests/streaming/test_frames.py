"""streamstudio.frames: the one converter, fit and colour parser, checked against values worked
out by hand."""

import numpy as np
import pytest
import torch
from PIL import Image

from streamstudio.errors import StreamStudioError
from streamstudio.frames import even_size, fit, fit_aspect, parse_color, to_pixels, to_rgb


def test_grey_becomes_three_equal_channels():
    grey = np.array([[0, 7], [128, 255]], np.uint8)
    for image in (grey, grey[:, :, None], torch.from_numpy(grey), Image.fromarray(grey)):
        out = to_rgb(image)
        assert out.shape == (2, 2, 3) and out.dtype == np.uint8 and out.flags.c_contiguous
        assert out[1, 0].tolist() == [128, 128, 128] and out[0, 1].tolist() == [7, 7, 7]


def test_rgba_is_composited_on_black():
    rgba = np.array([[[200, 100, 50, 255], [200, 100, 50, 0], [255, 255, 255, 51], [10, 20, 30, 128]]], np.uint8)
    assert to_rgb(rgba).tolist() == [[[200, 100, 50], [0, 0, 0], [51, 51, 51], [5, 10, 15]]]
    assert to_pixels(rgba).shape == (1, 4, 4)  # alpha kept for a consumer that composites itself
    from_pil = to_rgb(Image.fromarray(rgba, "RGBA"))
    assert np.array_equal(from_pil, to_rgb(rgba))


def test_floats_and_uint16_scale_to_whole_levels():
    floats = np.array([[[0.0, 0.5, 1.0]]], np.float32)
    assert to_rgb(floats).tolist() == [[[0, 128, 255]]]
    wide = np.array([[[0, 257 * 100, 65535]]], np.uint16)
    assert to_rgb(wide).tolist() == [[[0, 100, 255]]]


@pytest.mark.parametrize("bad, words", [
    (np.full((4, 4, 3), 1.5), r"\[0, 1\]"),
    (np.full((4, 4, 3), np.nan, np.float32), "finite"),
    (np.zeros((4, 4, 3), np.int32), "uint8"),
    (np.zeros((4, 4, 2), np.uint8), "shape"),
    (np.zeros((0, 4, 3), np.uint8), "empty"),
    ("a string", "expected an image"),
])
def test_bad_images_are_clear_errors(bad, words):
    with pytest.raises(StreamStudioError, match=words):
        to_rgb(bad)


def test_even_size_rounds_sides_up():
    assert even_size(63, 47) == (64, 48) and even_size(64, 48) == (64, 48)


def test_fit_pads_odd_sides_with_edge_pixels_and_resizes_other_sizes():
    frame = np.arange(5 * 7 * 3, dtype=np.uint8).reshape(5, 7, 3)
    padded = fit(frame, 8, 6)
    assert padded.shape == (6, 8, 3) and np.array_equal(padded[:5, :7], frame)
    assert np.array_equal(padded[5, :7], frame[4])  # edge repeated, not black
    assert np.array_equal(fit(frame, 6, 4), frame[:4, :6])
    assert fit(frame, 64, 40).shape == (40, 64, 3)
    with pytest.raises(StreamStudioError):
        fit(frame.astype(np.float32), 8, 6)


def test_fit_keeps_the_picture_unstretched():
    """A wide frame resized into a square is cut, not squeezed: a centred disc stays round."""
    yy, xx = np.mgrid[:40, :80]
    disc = (((yy - 19.5) ** 2 + (xx - 39.5) ** 2) < 15 ** 2).astype(np.uint8) * 255
    frame = np.repeat(disc[:, :, None], 3, axis=2)
    out = fit(frame, 20, 20)[:, :, 0] > 127
    rows, cols = np.nonzero(out)
    assert abs((rows.max() - rows.min()) - (cols.max() - cols.min())) <= 1


def test_fit_aspect_crops_to_the_aspect():
    img = np.arange(48 * 80 * 3, dtype=np.uint8).reshape(48, 80, 3)
    out = fit_aspect(img, 64, 64)
    assert out.shape == (48, 48, 3) and np.array_equal(out, img[:, 16:64])
    assert fit_aspect(img, 128, 32).shape == (20, 80, 3)


def test_fit_aspect_pads_keeping_the_whole_picture():
    img = np.full((48, 80, 3), 200, np.uint8)
    out = fit_aspect(img, 64, 64, "pad")  # wide into square: black bars above and below
    assert out.shape == (80, 80, 3) and np.array_equal(out[16:64], img)
    assert not out[:16].any() and not out[64:].any()
    tall = fit_aspect(img, 32, 128, "pad")  # into a tall frame: bars above and below too
    assert tall.shape == (320, 80, 3) and np.array_equal(tall[136:184], img)
    side = fit_aspect(np.full((80, 48, 3), 9, np.uint8), 64, 64, "pad")  # tall into square: bars left and right
    assert side.shape == (80, 80, 3) and (side[:, 16:64] == 9).all() and not side[:, :16].any()
    assert fit_aspect(img, 160, 96, "pad") is img  # the aspect already: untouched
    with pytest.raises(StreamStudioError, match="fit must be one of crop, pad"):
        fit_aspect(img, 64, 64, "stretch")


@pytest.mark.parametrize("text, rgb", [
    ("#ff8000", (1.0, 128 / 255, 0.0)), ("#FFF", (1.0, 1.0, 1.0)), ("rgba(255, 0, 51, 1)", (1.0, 0.0, 0.2)),
    ("rgb(0,255,0)", (0.0, 1.0, 0.0)), ("0.5, 0, 1", (0.5, 0.0, 1.0)), (None, (0.0, 0.0, 0.0)),
])
def test_parse_color_accepts_what_people_and_pickers_write(text, rgb):
    assert parse_color(text) == pytest.approx(rgb)


@pytest.mark.parametrize("text", ["blue-ish", "#12345", "1,2,3", "0.5,0.5", "rgb(300, 0, 0)"])
def test_parse_color_names_the_field_in_its_error(text):
    with pytest.raises(StreamStudioError, match=r"^--background .* is not a colour"):
        parse_color(text, "--background")
