"""The wheel: py3-none-manylinux_2_<glibc>_<arch>, carries the library, the
configs, the license and the metadata a package index shows, its tag is
honest about what the library needs, and it works installed without Go.

Without ``KVC_WHEEL`` the tests build a wheel from the source tree's library
(the host toolchain's, so its tag is whatever glibc that build needs). ``make
test-wheel`` sets ``KVC_WHEEL`` to the portable x86_64 wheel and runs this
file in a fresh venv where that wheel is installed; ``make
check-wheel-aarch64`` points it at the aarch64 wheel (the tests that load the
library skip there: it cannot run on this machine)."""

from __future__ import annotations

import email.parser
import glob
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest
from kvc_harness import REPO

KVC_WHEEL = os.environ.get("KVC_WHEEL")


def _elfcheck():
    spec = importlib.util.spec_from_file_location("kvc_elfcheck", os.path.join(REPO, "cabi", "elfcheck.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


elfcheck = _elfcheck()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    if KVC_WHEEL:
        assert os.path.isfile(KVC_WHEEL), KVC_WHEEL
        return KVC_WHEEL
    import setuptools  # noqa: F401  (the test extra installs both)
    import wheel as _wheel  # noqa: F401

    out = tmp_path_factory.mktemp("dist")
    env = dict(os.environ, KVC_ROUTER_SKIP_GO_BUILD="1")
    env.pop("KVC_ROUTER_TARGET", None)
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


@pytest.fixture(scope="module")
def lib_info(wheel):
    return elfcheck.read(elfcheck.library_in_wheel(wheel))


@pytest.fixture(scope="module")
def tags(wheel):
    t = elfcheck.wheel_platforms(os.path.basename(wheel))
    assert t, f"{wheel}: no manylinux platform tag"
    return t


def _runs_here(lib_info) -> bool:
    return lib_info.arch == platform.machine()


def _dist_info(z: zipfile.ZipFile, name: str) -> bytes:
    (path,) = [n for n in z.namelist() if re.fullmatch(r"kvc_router-[^/]+\.dist-info/" + name, n)]
    return z.read(path)


def test_wheel_tag_and_contents(wheel):
    name = os.path.basename(wheel)
    assert name.startswith("kvc_router-") and "-py3-none-manylinux_2_" in name, name
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = _dist_info(z, "WHEEL").decode()
    assert {
        "kvc_router/libkvcrouter.so",
        "kvc_router/configs/default.yaml",
        "kvc_router/configs/kvc_aware.yaml",
        "kvc_router/py.typed",
        "kvc_router/balancer.py",
        "kvc_router/metrics.py",
        "kvc_router_verl.pth",
        "_kvc_router_verl_boot.py",
    } <= names
    assert "Root-Is-Purelib: false" in meta
    assert re.search(r"^Tag: py3-none-manylinux_2_\d+_\w+$", meta, re.M), meta


def test_tag_is_honest(wheel, lib_info, tags):
    """The library needs no glibc newer than any tag the wheel claims, is
    built for the tagged architecture, links only manylinux libraries and
    exports only the C ABI."""
    assert lib_info.glibc is not None, "the library names no GLIBC_ symbol version"
    for major, minor, arch in tags:
        assert lib_info.arch == arch, (lib_info.arch, arch)
        assert lib_info.glibc <= (major, minor), f"needs glibc {lib_info.glibc}, tagged {major}.{minor}"
        assert elfcheck.problems(lib_info, arch, (major, minor)) == []
    assert set(lib_info.needed) <= elfcheck.ALLOWED_NEEDED
    assert all(s.startswith("kvr_") for s in lib_info.exports)
    assert "kvr_acquire" in lib_info.exports and "kvr_debug_panic" not in lib_info.exports


def test_tag_check_rejects_a_dishonest_tag(lib_info, tags):
    """The check above can fail: a tag older than what the library needs, or
    another architecture, is reported."""
    _, _, arch = tags[0]
    older = (lib_info.glibc[0], lib_info.glibc[1] - 1)
    found = elfcheck.problems(lib_info, arch, older)
    assert found and all("newer than glibc" in p for p in found), found
    other = "aarch64" if arch == "x86_64" else "x86_64"
    assert any("architecture" in p for p in elfcheck.problems(lib_info, other, None))


def test_portable_wheel_is_manylinux2014(wheel, tags):
    """`make wheel`'s wheels claim manylinux_2_17 (and its legacy alias)."""
    if not KVC_WHEEL:
        pytest.skip("a wheel of the host toolchain's library (make test-wheel checks the portable one)")
    arch = tags[0][2]
    assert sorted(tags) == [(2, 17, arch), (2, 17, arch)], tags
    assert os.path.basename(wheel).endswith(f"-manylinux_2_17_{arch}.manylinux2014_{arch}.whl")


def _auditwheel() -> list:
    exe = shutil.which("auditwheel") or os.path.join(os.path.dirname(sys.executable), "auditwheel")
    if not os.path.exists(exe):
        pytest.fail("auditwheel is not installed (the test extra and make test-wheel install it)")
    return [exe]


def test_auditwheel_agrees(wheel, tags):
    """auditwheel's own policy check: the wheel's tag is at or above the
    oldest manylinux policy auditwheel finds the library consistent with."""
    out = subprocess.run(_auditwheel() + ["show", wheel], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    m = re.search(r'consistent with the following platform tag: "manylinux_(\d+)_(\d+)_(\w+)"', text)
    assert m, out.stdout
    need = (int(m.group(1)), int(m.group(2)))
    for major, minor, arch in tags:
        assert m.group(3) == arch and need <= (major, minor), (m.groups(), tags)
    # Only system libraries: nothing auditwheel would have to graft in.
    assert "following external shared libraries are required" not in text, out.stdout


def test_metadata_and_license(wheel):
    """What a package index shows: summary, license expression and file,
    URLs, Python and platform classifiers; the license text is inside."""
    with zipfile.ZipFile(wheel) as z:
        meta = email.parser.BytesParser().parsebytes(_dist_info(z, "METADATA"))
        license_text = _dist_info(z, "licenses/LICENSE")
    assert meta["Name"] == "kvc-router"
    assert meta["Summary"] and "load balancer" in meta["Summary"]
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert meta["Requires-Python"] == ">=3.9"
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert {"Homepage", "Source", "Issues", "Documentation"} <= set(urls), urls
    assert all(u.startswith("https://") for u in urls.values())
    classifiers = set(meta.get_all("Classifier"))
    assert {
        "Operating System :: POSIX :: Linux",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.11",
        "Typing :: Typed",
    } <= classifiers
    # PEP 639: a license expression replaces the License :: classifiers.
    assert not [c for c in classifiers if c.startswith("License ::")]
    assert meta["Description-Content-Type"] == "text/markdown" and "kvc-router" in meta.get_payload()
    with open(os.path.join(REPO, "LICENSE"), "rb") as f:
        assert license_text == f.read()
    assert b"Apache License" in license_text and b"Version 2.0, January 2004" in license_text


def test_installed_wheel_needs_no_go(wheel, lib_info, tmp_path):
    if not _runs_here(lib_info):
        pytest.skip(f"{lib_info.arch} library cannot run on {platform.machine()}")
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


@pytest.mark.skipif(not KVC_WHEEL, reason="make test-wheel runs this file in a venv where KVC_WHEEL is installed")
def test_this_venv_runs_the_installed_wheel(wheel, lib_info):
    """In make test-wheel's clean venv: kvc_router and its library come from
    the installed wheel (not the source tree), and they route."""
    if not _runs_here(lib_info):
        pytest.skip(f"{lib_info.arch} library cannot run on {platform.machine()}")
    import kvc_router
    import kvc_router._native as native

    site = sysconfig.get_paths()["purelib"]
    assert os.path.realpath(kvc_router.__file__).startswith(os.path.realpath(site)), kvc_router.__file__
    assert os.path.isfile(os.path.join(site, "kvc_router_verl.pth"))
    lb = kvc_router.KVCAwareBalancer({"s0": None, "s1": None}, router_config="kvc_aware")
    try:
        first = lb.acquire_server("r0", list(range(256)))[0]
        # The same prompt again lands where its prefix is cached.
        assert lb.acquire_server("r1", list(range(256)))[0] == first
        assert lb.get_status()["router"]["counters"]["acquires"] == 2
    finally:
        lb.close()
    path = native.loaded_path()
    assert os.path.realpath(path).startswith(os.path.realpath(site)), path
    with open(path, "rb") as f:
        assert elfcheck.read(f.read()).glibc <= (2, 17)
