"""Runs tests/multidevice on 8 simulated CPU devices (XLA_FLAGS must be set before jax starts)."""

import os
import subprocess
import sys
from pathlib import Path

import runs


def test_multidevice_suite():
    here = Path(__file__).parent
    env = dict(os.environ, XLA_FLAGS=runs.xla_flags(8), JAX_PLATFORMS="cpu",
               JAXEMBED_MULTIDEVICE="1")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(here / "multidevice")],
                       env=env, capture_output=True, text=True, timeout=900, cwd=here.parent)
    print(r.stdout[-3000:])
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert " passed" in r.stdout and " failed" not in r.stdout
