"""A rolling model update on `serve --cluster` (issue 47): every replica replaced by one of the new
model, one at a time, no stream dropped.

For each replica that still runs the old model: it is drained (its streams move to the other
replicas at their next frames, with their settings, as `RayPlacement.drain` moves them),
it stops, and the watcher starts its replacement from the cluster's request, which now names the
new model; the next replica goes once the replacement is ready. A replica whose streams the
others have no room for waits until they have (streams end, or an elastic cluster grows) up to
`wait_s`; then the update stops and says so, leaving the replicas that were replaced running the
new model and the others the old one. `POST /studio/replicas/update` starts it; `/studio/status`
shows its progress (`update`).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace

from streamstudio.errors import StreamStudioError
from streamstudio.models.hub import check_model_source

log = logging.getLogger(__name__)

UPDATABLE = {"model": str, "taesd": bool, "lcm_lora": str}  # what an update may change in the image request


def updated_request(request, changes: dict):
    """The ServeRequest with the image request's `changes` (checked: known fields, right types)."""
    if not isinstance(changes, dict) or not changes:
        raise StreamStudioError(f'an update names what changes: an object with some of {", ".join(UPDATABLE)}')
    unknown = set(changes) - set(UPDATABLE)
    if unknown:
        raise StreamStudioError(f"an update cannot change {', '.join(sorted(unknown))}; it changes "
                                f"{', '.join(UPDATABLE)}")
    for name, value in changes.items():
        if not isinstance(value, UPDATABLE[name]):
            raise StreamStudioError(f"{name} must be a {UPDATABLE[name].__name__}, got {value!r}")
    if "model" in changes:
        check_model_source(changes["model"])  # a hub id that cannot be had: said now, before any replica goes
    return replace(request, image=replace(request.image, **changes))


class RollingUpdate:
    """One update of `placement`'s replicas (a ray_replicas.RayPlacement) to `changes`, in a thread."""

    def __init__(self, placement, changes: dict, wait_s: float = 300.0, ready_s: float = 600.0):
        self.placement, self.changes, self.wait_s, self.ready_s = placement, dict(changes), wait_s, ready_s
        self.old = [r for r in placement.healthy()]
        self.replaced = 0
        self.status = "running"
        self.error: str | None = None
        self.started = time.time()
        placement.cluster.request = updated_request(placement.cluster.request, changes)
        self._thread = threading.Thread(target=self._run, name="rolling-update", daemon=True)
        self._thread.start()

    def state(self) -> dict:
        return {"status": self.status, "changes": self.changes, "replaced": self.replaced, "of": len(self.old),
                "error": self.error}

    def wait(self, timeout: float | None = None) -> dict:
        self._thread.join(timeout)
        return self.state()

    def _run(self) -> None:
        try:
            for replica in self.old:
                self._replace(replica)
                self.replaced += 1
            self.status = "done"
            log.info("rolling update done: %d replica(s) run %s", self.replaced, self.changes)
        except StreamStudioError as exc:
            self.status, self.error = "stopped", str(exc)
            log.warning("rolling update stopped after %d of %d replica(s): %s", self.replaced, len(self.old), exc)
        except Exception as exc:  # pragma: no cover - a bug: said, and the server goes on
            self.status, self.error = "failed", f"{type(exc).__name__}: {exc}"
            log.exception("rolling update")

    def _replace(self, replica) -> None:
        placement = self.placement
        if replica.failed is not None or replica not in placement.replicas:
            return  # gone meanwhile (failed, drained): the watcher's replacement already runs the new model
        before = len(placement.healthy())
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                placement.drain(replica.index, retire=False)
                break
            except StreamStudioError as exc:
                if time.monotonic() > deadline or placement.stopping.is_set():
                    raise StreamStudioError(f"{replica.name} could not be replaced: {exc}") from None
                time.sleep(1.0)
        deadline = time.monotonic() + self.ready_s
        while replica in placement.replicas or len(placement.healthy()) < before:
            if time.monotonic() > deadline or placement.stopping.is_set():
                raise StreamStudioError(f"{replica.name}'s replacement was not ready within {self.ready_s:.0f} s")
            time.sleep(0.2)
        new = max(placement.healthy(), key=lambda r: r.index)
        placement.manager.model = new.model  # the banner and new streams' defaults: the new model's
        log.info("rolling update: %s replaced by %s (%d of %d)", replica.name, new.name, self.replaced + 1,
                 len(self.old))
