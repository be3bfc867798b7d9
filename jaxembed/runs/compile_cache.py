"""A run's compiled programs kept in its run directory (``train.compile_cache``, on by default): JAX's persistent
compilation cache in ``WORKDIR/jax_cache``, so a resumed run (after a preemption, or the same command again) loads
its train step and encoder instead of compiling them again: the train step of a real model takes tens of seconds to
compile on a GPU (compile times in benchmarks/gpu/README.md).

A cache configured by the user (``JAX_COMPILATION_CACHE_DIR``, ``jax.config``; the launchers in launch/ and
``jaxembed sweep`` set one) is used as it is. JAX writes entries from process 0 only; every process of a pod reads
them from the shared run directory. Only programs that took at least a second to compile are written (JAX's
``jax_persistent_cache_min_compile_time_secs``), so small helper programs add nothing. JAX's cache key includes the
cache's own path (XLA's autotuning cache lives inside it, and its path is a compile option), so a run directory
moved to another path compiles again, once.
"""

from __future__ import annotations

from pathlib import Path

import jax

from jaxembed.runs.rundir import NAMES, RunDir

DIRNAME = NAMES["jax_cache"]

#: the cache folder this module set (None: none, or the user's own)
_ours: str | None = None
_hits = 0
_listening = False


def _on_event(event: str, **_kw) -> None:
    global _hits
    if event == "/jax/compilation_cache/cache_hits":
        _hits += 1


def hits() -> int:
    """Programs this process has loaded from a persistent compilation cache so far."""
    return _hits


def use_for_run(rd: RunDir, enabled: bool = True) -> Path | None:
    """Make JAX's persistent compilation cache ``workdir/jax_cache`` (``enabled``), unless the user configured one,
    which stays; returns the cache folder in use, or None. Call before the run compiles its step: the cache is
    re-initialised, so programs compiled earlier in the process do not matter. A later run in the same process
    moves the cache to its own run directory (or turns it off with ``enabled=False``)."""
    global _listening
    current = jax.config.jax_compilation_cache_dir
    if not _listening:
        jax.monitoring.register_event_listener(_on_event)
        _listening = True
    if current and current != _ours:  # the user's own
        return Path(current)
    if not enabled:
        if current:  # ours, from an earlier run of this process
            _set(None)
        return None
    where = str(rd.jax_cache.absolute())
    if current != where:
        _set(where)
    return Path(where)


def _set(path: str | None) -> None:
    global _ours
    from jax.experimental.compilation_cache import compilation_cache

    jax.config.update("jax_compilation_cache_dir", path)
    compilation_cache.reset_cache()
    _ours = path
