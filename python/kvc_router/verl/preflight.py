"""``python -m kvc_router.verl status``: will this environment's verl take the hook?

A pre-flight check run in the environment verl runs in (Ray starts every
process of a verl job with the same interpreter, so what this process finds
is what they find). It answers, without starting anything:

* is kvc-router's native library loadable;
* is the start-up hook in place (``kvc_router_verl.pth``) and not switched off;
* is verl installed, which release, is that release supported / tested;
* each patch the hook makes: importing verl's patched modules here (the same
  import the job makes; it needs verl's dependencies, torch among them) and
  recording whether the patch applied;
* the installed rollout engines (vLLM, SGLang) and Ray;

and, for everything that is off, what to do. :func:`check` returns it all as
a dict (``--json`` prints that); :func:`render` is the text a person reads.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from typing import Any, Dict, List, Optional

from .detection import SUPPORTED_TEXT, TESTED_VERSIONS, is_tested, unsupported_reason, verl_version

#: What each patch is for, by the module it patches (docs/verl.md, "Patches").
_WHY = {
    "verl.utils.config.omega_conf_to_dataclass": "keeps the router key out of RolloutConfig",
    "verl.workers.rollout.llm_server.LLMServerManager._initialize_llm_servers": (
        "per-replica KV-event ports and vLLM log stats (kv_events: auto, enable_server_metrics)"
    ),
    "verl.workers.rollout.llm_server.LLMServerManager._init_global_load_balancer": "installs KVCAwareBalancer",
    "verl.workers.rollout.llm_server.LLMServerClient._acquire_server": (
        "sends prompt_ids to the balancer and batches acquires/releases"
    ),
    "verl.checkpoint_engine.base.CheckpointEngineManager.update_weights": (
        "resets the prefix index after each weight sync"
    ),
    "verl.workers.rollout.vllm_rollout.vllm_pd_replica.vLLMPDReplica._spawn_pd_server": (
        "gives each prefill/decode server of a vLLM replica its own KV-event ports"
    ),
    "verl.workers.rollout.sglang_rollout.sglang_pd_replica.SGLangPDReplica._launch_one": (
        "gives each prefill/decode server of an SGLang replica its own KV-event ports"
    ),
}
#: Patched modules that verl imports only with their engine installed (they
#: raise at import without it): checked when the engine is here, else noted.
_ENGINE_MODULES = {
    "verl.workers.rollout.vllm_rollout.vllm_pd_replica": "vllm",
    "verl.workers.rollout.sglang_rollout.sglang_pd_replica": "sglang",
}
#: Patches without which kvc_aware cannot run at all (the others degrade).
_ESSENTIAL_MODULES = ("verl.utils.config", "verl.workers.rollout.llm_server")
ENGINES = ("vllm", "sglang")
NOT_CHECKED = "not checked"
ABSENT = "module absent"
ENGINE_ABSENT = "engine absent"


def _dist_version(name: str) -> Optional[str]:
    """An installed distribution's version without importing it, or None."""
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover - Python < 3.8
        return None
    try:
        return version(name)
    except PackageNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - broken metadata reads as absent
        return None


def _verl_location() -> Optional[str]:
    try:
        spec = importlib.util.find_spec("verl")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    locs = list(spec.submodule_search_locations or [])
    return locs[0] if locs else spec.origin


def _library() -> Dict[str, Any]:
    from .. import __version__, _native

    out: Dict[str, Any] = {"version": __version__, "path": None, "build": None, "error": None}
    try:
        out["path"] = _native.library_path()
        out["build"] = _native.library_version()
    except Exception as e:  # noqa: BLE001 - reported, with the fix
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def _ensure_watcher() -> bool:
    """Puts kvc-router's import watcher on ``sys.meta_path`` for this check
    when the ``.pth`` did not (an editable install, or the hook switched off),
    so the patches are tried either way. Returns whether it was already there."""
    if any(type(f).__name__ == "VerlImportWatcher" for f in sys.meta_path):
        return True
    import _kvc_router_verl_boot as boot

    sys.meta_path.insert(0, boot.VerlImportWatcher())
    return False


def _check_patches(import_error: List[str]) -> Dict[str, Dict[str, str]]:
    """Imports each patched verl module (the watcher patches it as the job's
    import would) and reads the patch records."""
    from .patches import _TABLE, results

    out: Dict[str, Dict[str, str]] = {}
    for module, patches in _TABLE.items():
        state, detail = "", ""
        engine = _ENGINE_MODULES.get(module)
        if engine and module not in sys.modules and _dist_version(engine) is None:
            state, detail = ENGINE_ABSENT, f"{module} needs {engine}, which is not installed here"
        elif module not in sys.modules:
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as e:
                if e.name and (module == e.name or module.startswith(e.name + ".")) and e.name.startswith("verl"):
                    state, detail = ABSENT, f"this verl has no {module}"
                else:
                    state, detail = NOT_CHECKED, f"importing {module} failed: {type(e).__name__}: {e}"
                    import_error.append(detail)
            except Exception as e:  # noqa: BLE001 - verl's own import errors, shown with the fix
                state, detail = NOT_CHECKED, f"importing {module} failed: {type(e).__name__}: {e}"
                import_error.append(detail)
        recorded = results()
        for name, _ in patches:
            if state:
                out[name] = {"state": state, "detail": detail}
            elif name in recorded:
                st, det = recorded[name]
                out[name] = {"state": st, "detail": det}
            else:
                out[name] = {"state": NOT_CHECKED, "detail": f"{module} was imported before the hook"}
    return out


def check(import_verl: bool = True) -> Dict[str, Any]:
    """The pre-flight report as a dict; ``ready`` says whether a config with
    ``router.type: kvc_aware`` will run KVCAwareBalancer here, ``problems``
    lists what is off, each with what to do."""
    from .pth import ENV_SWITCH, status

    hook = status()
    problems: List[Dict[str, str]] = []
    notes: List[str] = []

    lib = _library()
    if lib["error"]:
        problems.append(
            {
                "what": f"the native library does not load: {lib['error']}",
                "fix": "reinstall kvc-router (the wheel carries libkvcrouter.so); from a checkout: "
                "make python/kvc_router/libkvcrouter.so",
            }
        )

    version = _dist_version("verl")
    location = _verl_location()
    installed = location is not None
    if installed and version is None:
        version = verl_version()
    verl: Dict[str, Any] = {
        "installed": installed,
        "version": version if installed else None,
        "location": location,
        "supported": False,
        "tested": False,
        "reason": None,
    }
    patches: Dict[str, Dict[str, str]] = {}
    import_errors: List[str] = []
    if not installed:
        verl["reason"] = "verl is not installed in this environment"
        problems.append(
            {
                "what": "verl is not installed in this interpreter (" + sys.executable + ")",
                "fix": f"pip install verl=={TESTED_VERSIONS[-1]} in this environment, or run this check with "
                f"the Python verl runs with; kvc-router supports {SUPPORTED_TEXT}",
            }
        )
    else:
        reason = unsupported_reason(version or "unknown")
        verl["reason"] = reason
        verl["supported"] = reason is None
        verl["tested"] = is_tested(version or "")
        if reason is not None:
            problems.append(
                {
                    "what": reason,
                    "fix": f"upgrade verl: pip install verl=={TESTED_VERSIONS[-1]} "
                    f"(a config asking for kvc_aware refuses to start on verl {version})",
                }
            )
        elif not verl["tested"]:
            notes.append(
                f"verl {version} is not a release kvc-router was tested with ({SUPPORTED_TEXT}); "
                "it runs if every patch below applies (one warning at start-up)"
            )
        if import_verl:
            _ensure_watcher()
            patches = _check_patches(import_errors)
        else:
            from .patches import _TABLE

            patches = {n: {"state": NOT_CHECKED, "detail": "--no-import"} for ps in _TABLE.values() for n, _ in ps}
    verl["import_errors"] = import_errors
    if import_errors:
        problems.append(
            {
                "what": "verl's modules do not import here: " + import_errors[0],
                "fix": "install verl's dependencies in this environment (torch, tensordict, transformers, "
                "ray, omegaconf, ...: pip install verl pulls them)",
            }
        )

    from .patches import FAILED

    if verl["supported"]:
        from .patches import _TABLE

        module_of = {n: m for m, ps in _TABLE.items() for n, _ in ps}
        for name, rec in patches.items():
            essential = module_of.get(name) in _ESSENTIAL_MODULES
            if rec["state"] == FAILED:
                problems.append(
                    {
                        "what": f"patch {name} cannot apply to verl {version} ({rec['detail']})",
                        "fix": f"use a tested verl ({', '.join(TESTED_VERSIONS)}); a config asking for "
                        "kvc_aware fails at start-up with this verl",
                    }
                )
            elif rec["state"] == ABSENT and essential:
                problems.append(
                    {
                        "what": f"patch {name}: {rec['detail']}",
                        "fix": f"use a tested verl ({', '.join(TESTED_VERSIONS)})",
                    }
                )
            elif rec["state"] in (ABSENT, ENGINE_ABSENT):
                notes.append(f"{name}: {rec['detail']}, so nothing {_WHY.get(name, 'is patched there')}")

    if hook["disabled_by_env"]:
        problems.append(
            {
                "what": f"{ENV_SWITCH}={os.environ.get(ENV_SWITCH)} switches the hook off: verl runs "
                "its own balancer and a `router:` block is an unknown key to verl",
                "fix": f"unset {ENV_SWITCH} (in the job's runtime_env too)",
            }
        )
    elif not hook["pth_installed"]:
        problems.append(
            {
                "what": f"the start-up hook {hook['pth']} is missing (an editable install has none), so "
                "verl's processes never load the patches",
                "fix": "python -m kvc_router.verl install (or install the kvc-router wheel)",
            }
        )

    engines = {name: _dist_version(name) for name in ENGINES}
    if not any(engines.values()):
        notes.append(
            "no rollout engine (vllm, sglang) is installed here; Ray starts the rollout servers with "
            "this interpreter, so a real job needs one (pip install vllm)"
        )
    ray = _dist_version("ray")
    if ray is None:
        problems.append(
            {
                "what": "Ray is not installed: verl creates the balancer as a Ray actor",
                "fix": "pip install 'kvc-router[ray]' (or verl, which requires Ray)",
            }
        )

    ready = not problems
    return {
        "ready": ready,
        "kvc_router": lib,
        "hook": hook,
        "verl": verl,
        "patches": patches,
        "engines": engines,
        "ray": ray,
        "python": sys.executable,
        "problems": problems,
        "notes": notes,
    }


def _state_word(state: str) -> str:
    return {"applied": "will apply", "not needed": "will apply (nothing to wrap in this release)"}.get(state, state)


def render(rep: Dict[str, Any]) -> str:
    """The report as text: one line per fact, problems and what to do last."""
    lines: List[str] = []
    lib = rep["kvc_router"]
    build = lib.get("build") or {}
    lines.append(f"kvc-router {lib['version']}  ({rep['python']})")
    if lib["error"]:
        lines.append(f"  native library: NOT LOADABLE ({lib['error']})")
    else:
        lines.append(
            f"  native library: {lib['path']} (build {build.get('version', '?')}, "
            f"ABI {build.get('abi_version', '?')}.{build.get('abi_minor', '?')})"
        )
    hook = rep["hook"]
    if hook["disabled_by_env"]:
        hook_text = "OFF (KVC_ROUTER_VERL_HOOK switches it off)"
    elif hook["pth_installed"]:
        hook_text = f"installed ({hook['pth']})"
    else:
        hook_text = f"MISSING ({hook['pth']} does not exist)"
    lines.append(f"  start-up hook: {hook_text}")
    v = rep["verl"]
    if not v["installed"]:
        lines.append(f"verl: NOT INSTALLED in this interpreter; kvc-router supports {SUPPORTED_TEXT}")
    else:
        if v["reason"]:
            verdict = "NOT SUPPORTED"
        elif v["tested"]:
            verdict = "supported (tested)"
        else:
            verdict = "supported range, untested release"
        lines.append(f"verl: {v['version']} at {v['location']}: {verdict}")
        if rep["patches"]:
            lines.append("  patches (verl's modules imported here, as the job imports them):")
            width = max(len(n) for n in rep["patches"])
            for name, rec in rep["patches"].items():
                extra = f" ({rec['detail']})" if rec["detail"] and rec["state"] != "applied" else ""
                lines.append(f"    {name:<{width}}  {_state_word(rec['state'])}{extra}")
    eng = ", ".join(f"{k} {val}" if val else f"{k} not installed" for k, val in rep["engines"].items())
    lines.append(f"engines: {eng}; ray {rep['ray'] or 'not installed'}")
    for n in rep["notes"]:
        lines.append(f"note: {n}")
    if rep["ready"]:
        lines.append("READY: a rollout config with `router: {type: kvc_aware}` will run KVCAwareBalancer here.")
    else:
        lines.append("NOT READY: a rollout config asking for kvc_aware will not run here. To do:")
        for p in rep["problems"]:
            lines.append(f"  - {p['what']}")
            lines.append(f"    fix: {p['fix']}")
    return "\n".join(lines)


def main(argv: List[str]) -> int:
    """``status [--json] [--no-import]``: exit 0 when ready, 1 when not."""
    unknown = [a for a in argv if a not in ("--json", "--no-import")]
    if unknown:
        from .pth import USAGE

        print(f"unknown option {unknown[0]!r}\n{USAGE}", file=sys.stderr)
        return 2
    as_json = "--json" in argv
    rep = check(import_verl="--no-import" not in argv)
    print(json.dumps(rep, indent=1) if as_json else render(rep))
    return 0 if rep["ready"] else 1
