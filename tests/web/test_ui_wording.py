"""The web app's words match what the page shows: the Live tab names the camera button by the
label the installed fastrtc component gives it, and the Text to image tab says what its buttons do."""

from __future__ import annotations

import re
from pathlib import Path

from types import SimpleNamespace

import pytest

gr = pytest.importorskip("gradio")
fastrtc = pytest.importorskip("fastrtc")

from streamstudio.app.web import ui  # noqa: E402
from streamstudio.pipelines.image.stream_diffusion import StreamDiffusionConfig  # noqa: E402


@pytest.fixture(scope="module")
def demo():
    """The app as `serve` builds it (the Video and Splats tabs left out), over a stand-in for the
    served model: the Live and Text to image tabs only read its names and defaults."""
    model = SimpleNamespace(name="stand-in", size=(64, 64), comps=None, is_demo=False, prompt="a cat",
                            negative_prompt="", config=StreamDiffusionConfig(width=64, height=64, steps=1))
    manager = SimpleNamespace(model=model, max_streams=1, pending_lists=[], peer_counters={})
    real, ui.optional_tabs = ui.optional_tabs, lambda manager, video_model=None: []
    try:
        return ui.build_ui(manager, file_ttl=60)
    finally:
        ui.optional_tabs = real


def fastrtc_start_label(button_labels: dict) -> str:
    """The text on the installed fastrtc WebRTC component's start button: its `button_labels`
    "start" when set, else the Gradio translation its frontend falls back to (English)."""
    if button_labels.get("start"):
        return button_labels["start"]
    bundle = Path(fastrtc.__file__).parent / "templates" / "component"
    code = "".join(p.read_text(errors="replace") for p in bundle.glob("index*.js"))
    # minified Svelte: (ctx[10].start || /*i18n*/ ctx[4]("audio.record")) + ""
    keys = set(re.findall(r"\.start\s*\|\|\s*/\*i18n\*/\s*\w+\[\d+\]\(\s*\"([\w.]+)\"\s*\)", code))
    assert len(keys) == 1, f"the start button's fallback label in {bundle} is not one i18n key: {keys}"
    section, key = keys.pop().split(".")
    return english(section, key)


def english(section: str, key: str) -> str:
    """Gradio's English text for `section.key`, read from its built frontend (the locale object
    named "English": {_name: ..., audio: Ar, ...}, Ar = {..., record: "Record", ...})."""
    assets = Path(gr.__file__).parent / "templates" / "frontend" / "assets"
    for path in assets.glob("*.js"):
        code = path.read_text(errors="replace")
        name = re.search(r"\b(\w+)=\"English\"", code)
        if not name:
            continue
        locale = re.search(r"\{_name:" + re.escape(name.group(1)) + r",[^;]*?\b" + section + r":(\w+)", code)
        part = locale and re.search(r"\b" + re.escape(locale.group(1)) + r"=\{([^{}]*)\}", code)
        text = part and re.search(r"\b" + key + r":\"([^\"]*)\"", part.group(1))
        if text:
            return text.group(1)
    pytest.fail(f"no English text for {section}.{key} in {assets}")


def blocks_in(demo, tab_id: str) -> list:
    """Every component inside the tab with id `tab_id`, in page order."""
    tab = next(b for b in demo.blocks.values() if isinstance(b, gr.Tab) and b.id == tab_id)
    found, todo = [], list(tab.children)
    while todo:
        block = todo.pop(0)
        found.append(block)
        todo[:0] = list(getattr(block, "children", []) or [])
    return found


def test_the_live_tabs_idle_status_names_the_camera_buttons_label(demo):
    """It said "Press the camera's start button"; fastrtc's button reads "Record"."""
    webrtc = next(b for b in blocks_in(demo, "live") if getattr(b, "elem_id", None) == "live-webrtc")
    label = fastrtc_start_label(webrtc.button_labels)
    assert label == "Record"  # fastrtc 0.0.x on Gradio 5, English; the tab's own words follow it
    stats = next(b for b in blocks_in(demo, "live") if getattr(b, "elem_id", None) == "live-stats")
    assert f"**{label}**" in stats.value and f"**{label}**" in ui.format_stats(None)


def test_the_text_to_image_tab_says_it_runs_from_start_to_stop(demo):
    """It said the image "regenerates continuously while you type"; it generates from Start, on
    a timer, until Stop, and typing does not start it. The words name the buttons the tab has."""
    blocks = blocks_in(demo, "t2i")
    text = next(b for b in blocks if isinstance(b, gr.Markdown)).value
    buttons = {b.value: b for b in blocks if isinstance(b, gr.Button)}
    assert {"Start", "Stop"} <= set(buttons)
    assert "**Start**" in text and "**Stop**" in text and "typing does not start it" in text
    timer = next(b for b in demo.blocks.values() if isinstance(b, gr.Timer) and b.value == ui.T2I_TICK_S)
    assert f"every {ui.T2I_TICK_S:g} s" in text
    # Start turns the timer on; typing only answers whether the tab is already running
    start = next(f for f in demo.fns.values() if (buttons["Start"]._id, "click") in f.targets)
    assert timer in start.outputs and not timer.active
    control = ui.T2IControl(SimpleNamespace())
    assert control.typed("fresh") is False and control.start("fresh") and control.typed("fresh")
