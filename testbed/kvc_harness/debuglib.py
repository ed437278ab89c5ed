"""The test build of libkvcrouter.so (``-tags kvrdebug``, adds kvr_debug_panic).

The release library does not export kvr_debug_panic; tests that need a Go
panic load this build instead, through ``$KVC_ROUTER_LIB`` in a subprocess or
by linking a C program to it. ``make testlib`` builds it; :func:`path` builds
it with the same command (cabi/build.sh) when it is missing or older than the
Go sources.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess

import pytest

from kvc_harness import REPO

TESTLIB = os.path.join(REPO, "build", "test", "libkvcrouter.so")


def _sources_mtime() -> float:
    files = glob.glob(os.path.join(REPO, "cabi", "*.go"))
    files += glob.glob(os.path.join(REPO, "core", "**", "*.go"), recursive=True)
    files += [os.path.join(REPO, p) for p in ("go.mod", "cabi/build.sh", "cabi/kvcrouter.map")]
    return max(os.path.getmtime(f) for f in files if os.path.exists(f))


def path() -> str:
    """The test library, built if needed; skips the test without Go."""
    if os.path.exists(TESTLIB) and os.path.getmtime(TESTLIB) >= _sources_mtime():
        return TESTLIB
    if not (os.environ.get("GO") or shutil.which("go")):
        pytest.skip("the test library (make testlib) is not built and Go is not on PATH")
    subprocess.run(["bash", os.path.join(REPO, "cabi", "build.sh"), TESTLIB, "kvrdebug"], check=True, timeout=600)
    return TESTLIB
