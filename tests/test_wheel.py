"""The wheel: py3-none-manylinux_2_<glibc>_<arch>, carries the library and the
configs, and works installed without Go (no go on PATH, no KVC_ROUTER_LIB)."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import zipfile

import pytest
from kvc_harness import REPO


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    import setuptools  # noqa: F401  (the test extra installs both)
    import wheel as _wheel  # noqa: F401
    out = tmp_path_factory.mktemp("dist")
    env = dict(os.environ, KVC_ROUTER_SKIP_GO_BUILD="1")
    if not os.path.exists(os.path.join(REPO, "python", "kvc_router", "libkvcrouter.so")):
        pytest.skip("library not built in the source tree")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), REPO],
        check=True,
        env=env,
        capture_output=True,
        timeout=300,
    )
    (whl,) = glob.glob(str(out / "*.whl"))
    return whl


def test_wheel_tag_and_contents(wheel):
    name = os.path.basename(wheel)
    assert name.startswith("kvc_router-") and "-py3-none-manylinux_2_" in name, name
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = z.read(next(n for n in names if n.endswith(".dist-info/WHEEL"))).decode()
    assert {
        "kvc_router/libkvcrouter.so",
        "kvc_router/configs/default.yaml",
        "kvc_router/configs/kvc_aware.yaml",
        "kvc_router/py.typed",
        "kvc_router/balancer.py",
    } <= names
    assert "Root-Is-Purelib: false" in meta


def test_installed_wheel_needs_no_go(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), wheel],
        check=True,
        timeout=300,
    )
    env = {k: v for k, v in os.environ.items() if k not in ("KVC_ROUTER_LIB", "PYTHONPATH")}
    env["PATH"] = os.path.dirname(sys.executable)  # no go here
    env["PYTHONPATH"] = str(target)
    code = (
        "import kvc_router, kvc_router._native as n; lb = kvc_router.KVCAwareBalancer({'s0': None}, "
        "router_config='kvc_aware'); print(lb.acquire_server('r', [1]*64)[0], n.loaded_path())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    sid, path = out.stdout.split()
    assert sid == "s0" and path.startswith(str(target))
