"""What a built libkvcrouter.so needs from the system, read from its ELF.

Standard library only: setup.py imports it (by path) to tag the wheel, the
wheel tests import it to check the tag, and ``make`` runs it as a command::

    python cabi/elfcheck.py LIB_OR_WHEEL [--arch x86_64|aarch64] [--max-glibc 2.17]

It reads the ELF header (architecture), the dynamic section (``DT_NEEDED``),
the version-needs section (``.gnu.version_r``: every ``GLIBC_x.y`` the
library was linked against, i.e. the oldest glibc that can load it) and the
dynamic symbol table (what the library exports). The check fails -- exit
status 1, one line per problem -- when the architecture differs, a needed
symbol version is newer than ``--max-glibc`` or is not a glibc one, a needed
library is outside the manylinux set, or a symbol other than ``kvr_*`` is
exported. A wheel argument checks ``kvc_router/libkvcrouter.so`` inside it
against the wheel's own platform tags.
"""

from __future__ import annotations

import argparse
import json
import re
import struct
import sys
import zipfile
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

#: e_machine values of the architectures a wheel is built for.
MACHINES: Dict[int, str] = {62: "x86_64", 183: "aarch64"}
#: Libraries every manylinux_2_17 (manylinux2014) system provides and the
#: library may link (PEP 599's list, minus the X11/GL ones it never needs).
ALLOWED_NEEDED = frozenset(
    {
        "libc.so.6",
        "libpthread.so.0",
        "libdl.so.2",
        "libm.so.6",
        "librt.so.1",
        "libgcc_s.so.1",
        "libresolv.so.2",
        "libutil.so.1",
        "libnsl.so.1",
        "ld-linux-x86-64.so.2",
        "ld-linux-aarch64.so.1",
    }
)
EXPORT_PREFIX = "kvr_"
_SHT_DYNSYM = 11
_SHT_DYNAMIC = 6
_SHT_GNU_VERNEED = 0x6FFFFFFE
_DT_NEEDED = 1
_STB_LOCAL = 0
_SHN_UNDEF = 0


@dataclass
class ElfInfo:
    """What one shared library needs and exports."""

    arch: str
    needed: List[str]
    #: ``(library, version)`` pairs from the version-needs section.
    versions: List[Tuple[str, str]]
    exports: List[str]
    glibc: Optional[Tuple[int, int]] = field(default=None)

    def as_dict(self) -> dict:
        return {
            "arch": self.arch,
            "needed": self.needed,
            "max_glibc": None if self.glibc is None else f"{self.glibc[0]}.{self.glibc[1]}",
            "versions": sorted({v for _, v in self.versions}),
            "exports": len(self.exports),
        }


def glibc_of(version: str) -> Optional[Tuple[int, int]]:
    m = re.fullmatch(r"GLIBC_(\d+)\.(\d+)(?:\.\d+)?", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def read(data: bytes) -> ElfInfo:
    """Parses a 64-bit little-endian ELF shared object."""
    if data[:4] != b"\x7fELF":
        raise ValueError("not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    (machine,) = struct.unpack_from("<H", data, 18)
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]

    def cstr(sec_index: int, off: int) -> str:
        base = sections[sec_index][4]  # sh_offset
        end = data.index(b"\0", base + off)
        return data[base + off : end].decode("ascii", "replace")

    needed: List[str] = []
    versions: List[Tuple[str, str]] = []
    exports: List[str] = []
    for _name, typ, _flags, _addr, off, size, link, info, _align, entsize in sections:
        if typ == _SHT_DYNAMIC:
            for p in range(off, off + size, 16):
                tag, val = struct.unpack_from("<qQ", data, p)
                if tag == 0:
                    break
                if tag == _DT_NEEDED:
                    needed.append(cstr(link, val))
        elif typ == _SHT_GNU_VERNEED:
            p = off
            for _ in range(info):  # sh_info = number of Verneed entries
                _ver, cnt, file_off, aux, nxt = struct.unpack_from("<HHIII", data, p)
                lib = cstr(link, file_off)
                a = p + aux
                for _ in range(cnt):
                    _hash, _vflags, _other, name_off, anext = struct.unpack_from("<IHHII", data, a)
                    versions.append((lib, cstr(link, name_off)))
                    a += anext
                p += nxt
        elif typ == _SHT_DYNSYM:
            for p in range(off + entsize, off + size, entsize):  # entry 0 is the null symbol
                name_off, st_info, _other, shndx = struct.unpack_from("<IBBH", data, p)
                if shndx != _SHN_UNDEF and st_info >> 4 != _STB_LOCAL:
                    exports.append(cstr(link, name_off))
    glibcs = [g for g in (glibc_of(v) for _, v in versions) if g]
    return ElfInfo(
        arch=MACHINES.get(machine, f"e_machine={machine}"),
        needed=needed,
        versions=versions,
        exports=sorted(exports),
        glibc=max(glibcs) if glibcs else None,
    )


def problems(info: ElfInfo, arch: Optional[str], max_glibc: Optional[Tuple[int, int]]) -> List[str]:
    """Everything that makes the library unfit for the given tag."""
    out = []
    if arch and info.arch != arch:
        out.append(f"architecture {info.arch}, expected {arch}")
    for lib, v in info.versions:
        g = glibc_of(v)
        if g is None:
            out.append(f"needs {v} from {lib}: not a glibc symbol version")
        elif max_glibc and g > max_glibc:
            out.append(f"needs {v} from {lib}, newer than glibc {max_glibc[0]}.{max_glibc[1]}")
    for lib in info.needed:
        if lib not in ALLOWED_NEEDED:
            out.append(f"links {lib}, which is not in the manylinux library set")
    for sym in info.exports:
        if not sym.startswith(EXPORT_PREFIX):
            out.append(f"exports {sym} (only {EXPORT_PREFIX}* may be exported)")
    if not any(s.startswith(EXPORT_PREFIX) for s in info.exports):
        out.append(f"exports no {EXPORT_PREFIX}* symbol")
    return out


def wheel_platforms(wheel_name: str) -> List[Tuple[int, int, str]]:
    """``(major, minor, arch)`` of each ``manylinux_X_Y_arch`` (or legacy
    ``manylinux2014_arch``) tag in a wheel file name."""
    plat = wheel_name[: -len(".whl")].split("-")[-1]
    out = []
    for tag in plat.split("."):
        m = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", tag)
        if m:
            out.append((int(m.group(1)), int(m.group(2)), m.group(3)))
        elif tag.startswith("manylinux2014_"):
            out.append((2, 17, tag[len("manylinux2014_") :]))
    return out


def library_in_wheel(path: str) -> bytes:
    with zipfile.ZipFile(path) as z:
        return z.read("kvc_router/libkvcrouter.so")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", help="libkvcrouter.so or a kvc_router wheel")
    ap.add_argument("--arch", choices=sorted(MACHINES.values()))
    ap.add_argument("--max-glibc", help="e.g. 2.17")
    a = ap.parse_args(argv)
    max_glibc = tuple(int(x) for x in a.max_glibc.split(".")) if a.max_glibc else None
    checks: List[Tuple[Optional[str], Optional[Tuple[int, int]]]] = [(a.arch, max_glibc)]
    if a.path.endswith(".whl"):
        data = library_in_wheel(a.path)
        tags = wheel_platforms(a.path.rsplit("/", 1)[-1])
        if not tags:
            print(f"{a.path}: no manylinux platform tag", file=sys.stderr)
            return 1
        checks += [(arch, (maj, mnr)) for maj, mnr, arch in tags]
    else:
        with open(a.path, "rb") as f:
            data = f.read()
    info = read(data)
    found: List[str] = []
    for arch, glibc in checks:
        found += [p for p in problems(info, arch, glibc) if p not in found]
    print(json.dumps({"path": a.path, **info.as_dict(), "problems": found}))
    for p in found:
        print(f"{a.path}: {p}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
