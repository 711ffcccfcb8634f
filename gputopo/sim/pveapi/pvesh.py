"""``pvesh`` on the simulated node: the API's handlers behind the command line."""

from __future__ import annotations

import json
import re
import time
from typing import TYPE_CHECKING, Any

from gputopo.errors import ProxmoxError
from gputopo.formats.lxcconf import check_lxc_option
from gputopo.sim import state
from gputopo.sim.pveapi.answers import ApiError
from gputopo.sim.pveapi.auth import Caller
from gputopo.sim.pveapi.params import BOOL_KEYS, fmt_bool
from gputopo.sim.pveapi.qemu_config import qemu_param_problem
from gputopo.sim.pveapi.routes import Route

if TYPE_CHECKING:
    from gputopo.sim.pveapi.server import PveApiServer

FORMAT_OPTIONS = ("output-format", "quiet", "noproxy")


def _cli_option(route: Route, name: str) -> bool:
    if name in route.params:
        return True
    if route.extra == "lxc" and re.match(r"^[a-z][a-z_]*\d*$", name):
        why = check_lxc_option(name, "")
        return not (why and why.startswith("unknown setting"))
    if route.extra == "qemu":
        why = qemu_param_problem(name, "")
        return not (why and "not defined in schema" in why)
    return False


def _cli_boolean(route: Route, name: str) -> bool:
    spec = route.params.get(name)
    if spec is not None:
        return spec.fmt is fmt_bool
    return route.extra == "lxc" and name in BOOL_KEYS


class PveshSim:
    """``pvesh`` on the simulated node, as a runner for the local backend (wire doc section 6).

    Call it as ``runner(argv, timeout) -> (stdout, stderr, rc)``. It runs as root@pam without
    the API permission check, takes ``-k v``/``--k v`` options (a repeated option becomes an
    array), prints canonical JSON (nothing for a null result), runs tasks synchronously, and
    reports errors on stderr the way Perl prints them.
    """

    VERBS = {"get": "GET", "set": "PUT", "create": "POST", "delete": "DELETE"}

    def __init__(self, server: PveApiServer):
        self.server = server
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], timeout: float) -> tuple[str, str, int]:
        self.calls.append(list(argv))
        if len(argv) < 3 or argv[0] != "pvesh" or argv[1] not in self.VERBS:
            return "", "USAGE: pvesh <COMMAND> [ARGS] [OPTIONS]\n", 255
        method, path = self.VERBS[argv[1]], "/" + argv[2].strip("/")
        try:
            route, _ = self.server.route(method, path)
        except ApiError:
            return "", f"No '{argv[1]}' handler defined for '{path}'\n", 1
        params: dict[str, Any] = {}
        rest = argv[3:]
        i = 0
        while i < len(rest):
            m = re.match(r"^--?([a-zA-Z][\w-]*)$", rest[i])
            k = m.group(1) if m else rest[i]
            # JS:get_options offers only the method's own parameters (Getopt::Long)
            if not m or i + 1 >= len(rest) or not (k in FORMAT_OPTIONS or _cli_option(route, k)):
                return "", f"Unknown option: {k}\n400 unable to parse option\n", 255
            v = rest[i + 1]
            i += 2
            if k in FORMAT_OPTIONS:
                continue
            if _cli_boolean(route, k):
                # JS:parse_boolean, for boolean parameters only
                v = {"yes": "1", "on": "1", "true": "1", "no": "0", "off": "0", "false": "0"}.get(
                    v.lower(), v
                )
            params[k] = (
                (params[k] if isinstance(params[k], list) else [params[k]]) + [v] if k in params else v
            )
        try:
            result = self.server.dispatch(method, path, params, Caller("root@pam", "cli"))
        except ApiError as e:
            if e.status == 500 and e.errors is None:
                return "", e.message, 255
            lines = f"{e.status} {e.message}"
            for k, v in (e.errors or {}).items():
                lines += f"{k}: {v}\n"
            return "", lines, 255
        data = result.data
        # what the handler printed on stderr reaches the terminal; pvesh still exits 0
        noise = "".join(result.stderr)
        if isinstance(data, str) and data.startswith("UPID:"):
            return self._run_task(argv, timeout, data, noise)
        if data is None:
            return "", noise, 0
        return json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n", noise, 0

    def _run_task(self, argv: list[str], timeout: float, upid: str, noise: str) -> tuple[str, str, int]:
        """A task under pvesh runs in the foreground (pve-common RESTEnvironment.pm fork_worker,
        ``$sync`` for the cli environment): the worker's output, its ``WARN:`` lines included
        (its stderr goes to the same pipe), streams to stdout, then the UPID; the ending goes
        to stderr: the error message, or ``Task finished with N warning(s)!``. pvesh exits 0."""
        due = state.read_state(self.server.run_dir, "tasks", {})[upid]["due"]
        if due - time.time() > timeout:
            # what gputopo.adapters.pvesh.run_command does when pvesh outlives its timeout
            time.sleep(max(0.0, timeout))
            raise ProxmoxError(" ".join(argv[:3]), None, f"timed out after {timeout:g} s")
        time.sleep(max(0.0, due - time.time()))  # it runs as long as it takes
        self.server._finish_task(upid)
        while True:  # the task's timer may be finishing it in another thread
            task = state.read_state(self.server.run_dir, "tasks", {})[upid]
            if task["status"] == "stopped":
                break
            time.sleep(0.01)
        lines = [ln for ln in task.get("log") or [] if not ln.startswith("TASK ")]
        out = "".join(ln + "\n" for ln in lines) + json.dumps(upid) + "\n"
        status = task["exitstatus"]
        if status == "OK":
            return out, noise, 0
        m = re.match(r"^WARNINGS: (\d+)$", status)
        ending = f"Task finished with {m.group(1)} warning(s)!" if m else status
        return out, noise + ending + "\n", 0
