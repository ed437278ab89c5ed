"""Builds libkvcrouter.so (Go, cgo c-shared) into the kvc_router package.

* ``build_py`` (run by ``pip install .``, ``pip install -e .``, ``pip wheel``
  and ``python -m build``) runs ``cabi/build.sh`` (the one c-shared build
  command, shared with the Makefile), writing python/kvc_router/libkvcrouter.so. Set ``KVC_ROUTER_SKIP_GO_BUILD=1`` to
  package an existing library instead (it must already be there).
* ``kvc_router_verl.pth`` goes to the root of the wheel (site-packages once
  installed): it imports ``_kvc_router_verl_boot``, the verl post-import hook
  (see python/kvc_router/verl/). ``KVC_ROUTER_VERL_HOOK=0`` disables it.
* The wheel is ``py3-none-<platform>``: one wheel serves every CPython (ctypes,
  no CPython ABI). On Linux the platform tag is ``manylinux_2_<N>_<arch>``
  where 2.<N> is the newest GLIBC_ symbol version the built library needs
  (from ``objdump -T``), so the tag is honest for the machine that built it.
  ``KVC_ROUTER_PLAT`` overrides the tag.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

ROOT = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.join(ROOT, "python", "kvc_router")
LIB = os.path.join(PKG, "libkvcrouter.so")
BUILD_SCRIPT = os.path.join(ROOT, "cabi", "build.sh")


def build_library() -> None:
    if os.environ.get("KVC_ROUTER_SKIP_GO_BUILD") == "1":
        if not os.path.isfile(LIB):
            raise SystemExit(f"KVC_ROUTER_SKIP_GO_BUILD=1 but {LIB} does not exist")
        return
    go = os.environ.get("GO") or shutil.which("go")
    if not go:
        raise SystemExit(
            "building kvc-router from source needs Go >= 1.26 on PATH (or GO=/path/to/go); "
            "install a prebuilt wheel to avoid it"
        )
    cmd = ["bash", BUILD_SCRIPT, LIB]
    print("kvc-router: " + " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, GO=go), check=True)


def max_glibc(path: str) -> tuple[int, int] | None:
    """Newest GLIBC_x.y symbol version the library references."""
    try:
        out = subprocess.run(["objdump", "-T", path], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    versions = {(int(a), int(b)) for a, b in re.findall(r"GLIBC_(\d+)\.(\d+)", out)}
    return max(versions) if versions else None


def platform_tag() -> str:
    override = os.environ.get("KVC_ROUTER_PLAT")
    if override:
        return override
    machine = platform.machine().lower()
    if sys.platform.startswith("linux"):
        glibc = max_glibc(LIB) if os.path.isfile(LIB) else None
        if glibc:
            # manylinux_2_17 is the oldest tag pip understands in this form.
            major, minor = max(glibc, (2, 17))
            return f"manylinux_{major}_{minor}_{machine}"
        return f"linux_{machine}"
    from setuptools._distutils.util import get_platform  # pragma: no cover

    return get_platform().replace("-", "_").replace(".", "_")  # pragma: no cover


PTH = os.path.join(ROOT, "python", "kvc_router_verl.pth")


class BuildPyWithGo(build_py):
    def run(self) -> None:
        build_library()
        super().run()
        # The verl post-import hook: a .pth at the root of site-packages
        # (imports _kvc_router_verl_boot). Editable installs do not get it;
        # `python -m kvc_router.verl install` writes it by hand.
        if not getattr(self, "editable_mode", False):
            self.copy_file(PTH, os.path.join(self.build_lib, os.path.basename(PTH)))

    def get_outputs(self, include_bytecode: bool = True) -> list:
        outputs = super().get_outputs(include_bytecode)
        if not getattr(self, "editable_mode", False):
            outputs.append(os.path.join(self.build_lib, os.path.basename(PTH)))
        return outputs


class PlatformWheel(bdist_wheel):
    def finalize_options(self) -> None:
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self) -> tuple[str, str, str]:
        return "py3", "none", platform_tag()


class BinaryDistribution(Distribution):
    """The package carries a native library: never a pure wheel."""

    def has_ext_modules(self) -> bool:
        return True


setup(
    distclass=BinaryDistribution,
    cmdclass={"build_py": BuildPyWithGo, "bdist_wheel": PlatformWheel},
)
