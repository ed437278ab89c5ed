"""Builds libkvcrouter.so (Go, cgo c-shared) into the kvc_router package.

* ``build_py`` (run by ``pip install .``, ``pip install -e .``, ``pip wheel``
  and ``python -m build``) runs ``cabi/build.sh`` (the one c-shared build
  command, shared with the Makefile), writing python/kvc_router/libkvcrouter.so.
  Set ``KVC_ROUTER_SKIP_GO_BUILD=1`` to package an existing library instead
  (it must already be there).
* ``KVC_ROUTER_TARGET=x86_64`` or ``aarch64`` builds the portable library
  instead (glibc 2.17, Zig as cgo's C compiler; see cabi/build.sh) into
  build/portable/<arch>/ -- the source tree's library is left alone -- and
  packages that one. ``make wheel`` builds both this way.
* ``kvc_router_verl.pth`` goes to the root of the wheel (site-packages once
  installed): it imports ``_kvc_router_verl_boot``, the verl post-import hook
  (see python/kvc_router/verl/). ``KVC_ROUTER_VERL_HOOK=0`` disables it.
* The wheel is ``py3-none-<platform>``: one wheel serves every CPython (ctypes,
  no CPython ABI). On Linux the platform tag is ``manylinux_2_<N>_<arch>``
  where ``<arch>`` is the library's ELF machine and 2.<N> the newest
  ``GLIBC_`` symbol version it needs (cabi/elfcheck.py reads both from the
  library that goes into the wheel), so the tag is honest; 2.17 also carries
  its legacy alias ``manylinux2014_<arch>`` for pip < 20.3.
  ``KVC_ROUTER_PLAT`` overrides the tag.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from typing import Optional

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
PORTABLE_ARCHES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}
#: The library build_py put into the wheel's tree (what get_tag reads).
SHIPPED: Optional[str] = None


def _elfcheck():
    spec = importlib.util.spec_from_file_location("kvc_elfcheck", os.path.join(ROOT, "cabi", "elfcheck.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look the module up
    spec.loader.exec_module(mod)
    return mod


def target_arch() -> Optional[str]:
    t = os.environ.get("KVC_ROUTER_TARGET")
    if not t:
        return None
    if t not in PORTABLE_ARCHES:
        raise SystemExit(f"KVC_ROUTER_TARGET={t!r} (allowed: x86_64, aarch64)")
    return PORTABLE_ARCHES[t]


def library_path() -> str:
    """Where the library to package is built: the source tree, or
    build/portable/<arch>/ for a portable build."""
    arch = target_arch()
    return LIB if arch is None else os.path.join(ROOT, "build", "portable", arch, "libkvcrouter.so")


def build_library() -> str:
    lib = library_path()
    if os.environ.get("KVC_ROUTER_SKIP_GO_BUILD") == "1":
        if not os.path.isfile(lib):
            raise SystemExit(f"KVC_ROUTER_SKIP_GO_BUILD=1 but {lib} does not exist")
        return lib
    go = os.environ.get("GO") or shutil.which("go")
    if not go:
        raise SystemExit(
            "building kvc-router from source needs Go >= 1.26 on PATH (or GO=/path/to/go); "
            "install a prebuilt wheel to avoid it"
        )
    cmd = ["bash", BUILD_SCRIPT, lib]
    print("kvc-router: " + " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, GO=go), check=True)
    return lib


def platform_tag() -> str:
    override = os.environ.get("KVC_ROUTER_PLAT")
    if override:
        return override
    lib = SHIPPED or library_path()
    if sys.platform.startswith("linux") and os.path.isfile(lib):
        with open(lib, "rb") as f:
            info = _elfcheck().read(f.read())
        # manylinux_2_17 is the oldest tag pip understands in this form.
        major, minor = max(info.glibc or (2, 17), (2, 17))
        tag = f"manylinux_{major}_{minor}_{info.arch}"
        return tag + f".manylinux2014_{info.arch}" if (major, minor) == (2, 17) else tag
    from setuptools._distutils.util import get_platform  # pragma: no cover

    return get_platform().replace("-", "_").replace(".", "_")  # pragma: no cover


PTH = os.path.join(ROOT, "python", "kvc_router_verl.pth")


class BuildPyWithGo(build_py):
    def run(self) -> None:
        global SHIPPED
        lib = build_library()
        super().run()
        if not getattr(self, "editable_mode", False):
            # Always the library just built or chosen: a copy left in
            # build/lib by an earlier build (another architecture) must not
            # ship, and copy_file skips destinations that look newer.
            dest = os.path.join(self.build_lib, "kvc_router", "libkvcrouter.so")
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copyfile(lib, dest)
            SHIPPED = dest
            # The verl post-import hook: a .pth at the root of site-packages
            # (imports _kvc_router_verl_boot). Editable installs do not get it;
            # `python -m kvc_router.verl install` writes it by hand.
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
