"""Joining Ray, for the two commands that use it (`render --cluster`'s batch executor in
app/batch/cluster.py and `serve --cluster`'s replicas in app/web/ray_replicas.py)."""

from __future__ import annotations


def connect_ray(address: str | None, num_cpus: int | None = None) -> bool:
    """Connect to the Ray cluster at `address` (HOST:6379, ray://HOST:10001, auto), or start a
    local one with `num_cpus` CPUs (None: all) when `address` is empty. Nothing happens when this
    process is already connected. Returns whether this call started a local Ray (the caller
    shuts it down when done)."""
    import ray

    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, log_to_driver=False)
        return False
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    return True
