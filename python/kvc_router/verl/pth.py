"""The ``kvc_router_verl.pth`` start-up file: where it is, what is active.

``python -m kvc_router.verl install|uninstall`` writes / removes it (an
editable install has none); ``status`` is the pre-flight check
(:mod:`.preflight`).
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
from typing import List, Optional

PTH_NAME = "kvc_router_verl.pth"
PTH_LINE = "import _kvc_router_verl_boot\n"
ENV_SWITCH = "KVC_ROUTER_VERL_HOOK"
USAGE = (
    "usage: python -m kvc_router.verl [status [--json] [--no-import] | install | uninstall]\n"
    "  status     pre-flight check: verl found, its release, supported or not, each patch, engines;\n"
    "             exit 0 when a kvc_aware config will run here, 1 when not (--json: machine-readable)"
)


def pth_path() -> str:
    return os.path.join(sysconfig.get_paths()["purelib"], PTH_NAME)


def status() -> dict:
    from .actor import registered_balancers
    from .patches import results

    boot = sys.modules.get("_kvc_router_verl_boot")
    return {
        "pth": pth_path(),
        "pth_installed": os.path.isfile(pth_path()),
        "boot_module": getattr(boot, "__file__", None),
        "watcher_active": any(type(f).__name__ == "VerlImportWatcher" for f in sys.meta_path),
        "disabled_by_env": os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"),
        "patches": {name: state for name, (state, _) in sorted(results().items())},
        "balancers_in_process": len(registered_balancers()),
    }


def main(argv: Optional[List[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv) or ["status"]
    cmd = args[0]
    if cmd == "install":
        with open(pth_path(), "w", encoding="utf-8") as f:
            f.write(PTH_LINE)
        print(f"wrote {pth_path()}")
    elif cmd == "uninstall":
        if os.path.isfile(pth_path()):
            os.remove(pth_path())
            print(f"removed {pth_path()}")
    elif cmd == "status":
        # The pre-flight check: verl found, its release, each patch, engines.
        from .preflight import main as preflight

        return preflight(args[1:])
    else:
        print(USAGE, file=sys.stderr)
        return 2
    print(json.dumps(status(), indent=1))
    return 0
