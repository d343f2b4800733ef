"""A mido backend with one fake controller, "Fake Knobs 20:0" (tests/perform/test_midi_port.py):
mido's own port classes and message objects, the hardware replaced by `play(message)`, which
delivers a message to every open port as a driver's thread would. Selected with
`mido.set_backend("fake_midi_backend")`; no ALSA sequencer or rtmidi needed."""

from __future__ import annotations

import mido.ports

NAMES = ["Fake Knobs 20:0", "Other Synth 24:0"]
OPEN: list["Input"] = []


def get_devices(**kwargs):
    return [{"name": n, "is_input": True, "is_output": False} for n in NAMES]


class Input(mido.ports.BaseInput):
    def _open(self, callback=None, virtual=False, **kwargs):
        if self.name not in NAMES:
            raise OSError(f"unknown port {self.name!r}")
        self.callback = callback
        OPEN.append(self)

    def _close(self):
        OPEN.remove(self)


def play(message) -> None:
    for port in list(OPEN):
        if port.callback is not None:
            port.callback(message)
        else:
            port._messages.append(message)
