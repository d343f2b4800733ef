"""Joining Ray, for the two commands that use it (`render --cluster`'s batch executor in
app/batch/cluster.py and `serve --cluster`'s replicas in app/web/ray_replicas.py)."""

from __future__ import annotations

import os

# Ray's switch for a one-machine cluster (its default on macOS and Windows): every Ray process takes
# 127.0.0.1 as its node address, and Ray 2.60's servers bind their node address, so GCS, the raylet,
# the object manager and every worker listen on loopback alone. Without it Ray replaces 127.0.0.1 by
# the machine's address and listens on every interface (`ss -ltnp` shows `*:PORT`).
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def loopback_only() -> None:
    """Make the local Ray that this process starts next listen on 127.0.0.1 only: the processes it
    spawns read LOOPBACK_ENV from the environment, this one from Ray's constant (read at call time,
    so it holds though ray was imported before)."""
    os.environ[LOOPBACK_ENV] = "0"
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


def follow_cluster_login() -> None:
    """Use Ray's token login when the cluster does. `ray start --head` turns it on when a token is
    at hand (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token, which any local `ray.init()`
    writes), but a driver given an explicit address never does, and then fails on
    InvalidAuthToken. Here, as `ray start` decides: with RAY_AUTH_MODE unset and a token at hand,
    token mode. A Ray without token login (before 2.52) has nothing to follow."""
    if os.environ.get("RAY_AUTH_MODE"):
        return
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available)
    except ImportError:
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def connect_ray(address: str | None, num_cpus: int | None = None) -> bool:
    """Connect to the Ray cluster at `address` (HOST:6379, ray://HOST:10001, auto), or start a
    local one with `num_cpus` CPUs (None: all) when `address` is empty, listening on 127.0.0.1 only
    (`loopback_only`). Nothing happens when this process is already connected. Returns whether
    this call started a local Ray (the caller shuts it down when done)."""
    import ray

    if ray.is_initialized():
        return False
    if address:
        follow_cluster_login()
        ray.init(address=address, log_to_driver=False)
        return False
    loopback_only()
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    return True
