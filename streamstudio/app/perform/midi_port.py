"""A MIDI input port on the server (issue 48): `serve --midi-in NAME` reads a controller or a DAW
plugged into the server's own machine through mido (python-rtmidi: ALSA on Linux, CoreMIDI,
Windows MM), where the Live tab's WebMIDI reads one plugged into the performer's computer.

Control changes go to `LiveInputs.control_change` (a mapping `{"kind": "midi", "cc": N}` applies
them at the next frame), timing clock pulses (0xF8, 24 a quarter note) to the tempo clock, and a
Start (0xFA) puts the next pulse on a downbeat. mido and python-rtmidi are the `midi` extra
(`pip install "streamstudio[midi]"`); mido's MIDO_BACKEND chooses another backend.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from streamstudio.app.perform.inputs import LiveInputs
from streamstudio.errors import StreamStudioError

log = logging.getLogger(__name__)

INSTALL = 'pip install "streamstudio[midi]" (mido and python-rtmidi)'


def _mido() -> Any:
    try:
        import mido  # optional: the `midi` extra
    except ImportError as exc:
        raise StreamStudioError(f"--midi-in needs mido: {INSTALL}") from exc
    return mido


def input_names() -> list[str]:
    """The MIDI inputs this machine has (empty where no MIDI system or backend answers)."""
    try:
        return list(_mido().get_input_names())
    except StreamStudioError:
        raise
    except Exception as exc:  # no ALSA sequencer, no backend module: no ports, said by the caller
        log.debug("MIDI inputs unreadable: %s", exc)
        return []


def pick_input(name: str, names: list[str]) -> str:
    """The port `name` names: itself, or the one port whose name starts with it (ALSA adds client
    and port numbers: "nanoKONTROL2" for "nanoKONTROL2:nanoKONTROL2 _ CTRL 20:0")."""
    if name in names:
        return name
    starts = [n for n in names if n.lower().startswith(name.lower())]
    if len(starts) == 1:
        return starts[0]
    have = ", ".join(repr(n) for n in names) or "none (is the controller plugged in, and is its driver loaded?)"
    why = "several" if starts else "no"
    raise StreamStudioError(f"--midi-in {name!r}: {why} MIDI input of that name; this machine has: {have}")


class MidiPort:
    """An open MIDI input feeding `inputs` until `close()`. mido calls `on_message` on its own
    thread; a bad message is logged once and dropped, never raised into that thread."""

    def __init__(self, inputs: LiveInputs, name: str):
        self.inputs, self.messages = inputs, 0
        mido = _mido()
        self.name = pick_input(name, input_names())
        self._started = False  # a Start arrived: the next clock pulse is a downbeat
        self._lock = threading.Lock()
        try:
            self._port = mido.open_input(self.name, callback=self.on_message)
        except Exception as exc:
            raise StreamStudioError(f"--midi-in {self.name!r} could not be opened: {exc}") from exc
        log.info("MIDI input %r open: control changes and clock to the streams' modulations", self.name)

    def on_message(self, msg) -> None:
        now = time.monotonic()
        try:
            if msg.type == "control_change":
                self.inputs.control_change(msg.control, msg.value, msg.channel + 1)  # mido's channels are 0..15
            elif msg.type == "clock":
                self.inputs.clock.midi_pulse(now)
                with self._lock:
                    started, self._started = self._started, False
                if started:
                    self.inputs.clock.downbeat(now)
            elif msg.type == "start":
                with self._lock:
                    self._started = True
            else:
                return
            self.messages += 1
        except Exception:  # pragma: no cover - keep the port's thread alive
            log.exception("MIDI message %r from %r dropped", msg, self.name)

    def close(self) -> None:
        self._port.close()
