"""Running the collection's gputopo.proxmox.topology module as Ansible runs it on a node: the
module file with its arguments in a JSON file (``{"ANSIBLE_MODULE_ARGS": ...}``, check and diff
mode as the ``_ansible_check_mode`` / ``_ansible_diff`` arguments Ansible adds), its result the
JSON it prints. Needs ansible-core importable by this Python (the [test] extra)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers import REPO

COLLECTION = REPO / "ansible_collections/gputopo/proxmox"
MODULE = COLLECTION / "plugins/modules/topology.py"
REQUIRE = os.environ.get("GPUTOPO_REQUIRE_ANSIBLE") == "1"


def require_ansible() -> None:
    """Skip (fail with GPUTOPO_REQUIRE_ANSIBLE=1) when ansible-core is not installed."""
    try:
        import ansible.module_utils.basic  # noqa: F401
    except ImportError:
        if REQUIRE:
            pytest.fail("GPUTOPO_REQUIRE_ANSIBLE=1 but ansible-core is not installed", pytrace=False)
        pytest.skip("ansible-core is not installed (pip install 'gputopo[test]')")


def ansible_tool(name: str) -> str:
    """The path of ansible-core's ``name`` command (ansible-doc, ansible-test, ...)."""
    require_ansible()
    exe = Path(sys.executable).parent / name
    found = str(exe) if exe.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"ansible-core is installed but {name} is not on PATH", pytrace=False)
    return found


def run_module(
    tmp_path: Path, args: dict[str, Any], check: bool = False, diff: bool = False, env: dict | None = None
) -> tuple[dict[str, Any], str]:
    """The module's result for ``args`` and the exact text it printed (to look for secrets in)."""
    require_ansible()
    payload = {"ANSIBLE_MODULE_ARGS": {**args, "_ansible_check_mode": check, "_ansible_diff": diff}}
    path = tmp_path / "module-args.json"
    path.write_text(json.dumps(payload))
    run_env = dict(os.environ, **(env or {}))
    run_env["PATH"] = f"{Path(sys.executable).parent}:{run_env.get('PATH', '')}"
    res = subprocess.run(
        [sys.executable, str(MODULE), str(path)], capture_output=True, text=True, env=run_env, timeout=600
    )
    try:
        return json.loads(res.stdout), res.stdout
    except ValueError:
        pytest.fail(
            f"the module printed no JSON (exit {res.returncode}): {res.stdout[-2000:]} {res.stderr[-2000:]}"
        )


def warnings(result: dict[str, Any]) -> list[str]:
    """The result's warnings as text (ansible-core 2.19 wraps each in a summary object)."""
    out = []
    for w in result.get("warnings", []):
        out.append(w["event"]["msg"] if isinstance(w, dict) else w)
    return out


def load_module() -> Any:
    """The module's source imported as a Python module (its main() is not run): its
    ARGUMENT_SPEC, and DOCUMENTATION, EXAMPLES and RETURN parsed as YAML with :func:`doc`."""
    import importlib.util

    require_ansible()
    spec = importlib.util.spec_from_file_location("gputopo_topology_module", MODULE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def doc(name: str) -> Any:
    """The module's DOCUMENTATION, EXAMPLES or RETURN as data."""
    return yaml.safe_load(getattr(load_module(), name))


def recording_gputopo(tmp_path: Path, log: Path, root: Path | None = None) -> Path:
    """A gputopo that first appends its argv and the secrets in its environment to ``log`` (one
    JSON line per run), then runs this checkout's gputopo, with ``--root ROOT`` added when given:
    a simulated host's root standing in for the node's own, whose API is reached over HTTPS."""
    exe = tmp_path / "gputopo-recording"
    extra = ["--root", str(root)] if root is not None else []
    exe.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "keys = ('GPUTOPO_PVE_PASSWORD', 'GPUTOPO_PVE_TOKEN', 'GPUTOPO_PVE_TOKEN_SECRET')\n"
        f"with open({str(log)!r}, 'a') as f:\n"
        "    f.write(json.dumps({'argv': sys.argv, 'env': {k: os.environ.get(k) for k in keys}}) + '\\n')\n"
        f"os.execv(sys.executable, [sys.executable, '-m', 'gputopo', *sys.argv[1:], *{extra!r}])\n"
    )
    exe.chmod(0o755)
    return exe


def recorded(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
