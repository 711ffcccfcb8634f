"""The request pipeline of the simulated API, in Proxmox's order.

401 (authentication, before this) before 501 (no route) before 403 (permission) before 400
(parameters) before the handler; a path of another cluster member goes to that member after the
permission check, a node name that is no member fails like a hostname lookup, and an injected
API fault (a pmxcfs lock timeout) answers before the handler runs.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from gputopo.formats.lxcconf import check_lxc_option
from gputopo.sim import state
from gputopo.sim.pveapi.answers import ApiError, Result, die, param_error, perm_error
from gputopo.sim.pveapi.auth import Caller
from gputopo.sim.pveapi.cfslock import release
from gputopo.sim.pveapi.params import BOOL_KEYS, ItemErrors, fmt_bool, perl_str
from gputopo.sim.pveapi.qemu_config import qemu_key_known, qemu_param_problem
from gputopo.sim.pveapi.routes import Route, find_route

API_FAULTS = "api-faults"
_printed = threading.local()  # what the running handler printed on stderr (one request per thread)


class Pipeline:
    """Routing, checks and dispatch of :class:`gputopo.sim.pveapi.PveApiServer` (a mixin)."""

    def inject_api_fault(
        self, method: str, path: str, message: str, status: int = 500, count: int = 1
    ) -> None:
        """Make the next ``count`` ``method`` calls whose API path (below ``/api2/json``) matches
        the regex ``path`` fail with ``status`` and ``message``, as a node answers when pmxcfs
        cannot take its lock (``cfs-lock 'file-pci_mapping' error: got lock request timeout``)."""
        with state.locked(self.run_dir, API_FAULTS):
            faults = state.read_state(self.run_dir, API_FAULTS, []) or []
            faults.append(
                {"method": method, "path": path, "message": message, "status": status, "count": count}
            )
            state.write_state(self.run_dir, API_FAULTS, faults)

    def _take_api_fault(self, method: str, path: str) -> ApiError | None:
        if not (self.run_dir / f"{API_FAULTS}.json").exists():
            return None
        with state.locked(self.run_dir, API_FAULTS):
            faults = state.read_state(self.run_dir, API_FAULTS, []) or []
            for f in faults:
                if f["method"] == method and re.fullmatch(f["path"], path) and f["count"] > 0:
                    f["count"] -= 1
                    state.write_state(self.run_dir, API_FAULTS, [x for x in faults if x["count"] > 0])
                    return ApiError(int(f["status"]), f["message"].rstrip("\n") + "\n")
        return None

    def hold_cfs_lock(self, lockid: str, seconds: float) -> None:
        """Let someone else hold the pmxcfs lock ``lockid`` (``file-mapping_pci_cfg`` for
        ``mapping/pci.cfg``) for ``seconds`` from now, as another node's writer would: the lock
        directory exists until then (:mod:`gputopo.sim.pveapi.cfslock`), so a write that needs
        it waits."""
        path = self.pve_root / "priv" / "lock" / lockid
        path.mkdir(parents=True)
        timer = threading.Timer(seconds, release, (path,))
        timer.daemon = True
        timer.start()

    def print_stderr(self, text: str) -> None:
        """What a handler prints on stderr (a Perl ``warn``; a newline is added when ``text``
        has none): the answer's ``Result.stderr``."""
        getattr(_printed, "lines", []).append(text if text.endswith("\n") else text + "\n")

    @staticmethod
    def route(method: str, path: str) -> tuple[Route, dict[str, str]]:
        """The route of ``method path`` and its URI parameters. Raises ApiError 501."""
        return find_route(method, path)

    def dispatch(self, method: str, path: str, params: dict[str, Any], caller: Caller | None) -> Result:
        """Route, check permissions and parameters, run the handler. Raises ApiError."""
        route, uri = self.route(method, path)
        for k, v in uri.items():
            if k in params and perl_str(params[k]) != v:
                raise param_error(
                    {k: "duplicate parameter (already defined in URI) with conflicting values!"}
                )
            params[k] = v
        if route.perm and caller is not None:
            acl, privs = route.perm
            if not self._has_any(caller, privs):
                # an any-of check on a single object reports no detail (RPCEnvironment check_any)
                raise perm_error(
                    None if route.handler == "mapping_get" else f"{acl.format(**uri)}, {'|'.join(privs)}"
                )
        peer = self.forward_to(uri.get("node"))
        if peer is not None:
            # pveproxy proxies a node's method to that node after its own permission check
            # (pve-manager PVE/HTTPServer.pm rest_handler); the node checks everything again
            return peer.dispatch(method, path, {k: v for k, v in params.items() if k not in uri}, caller)
        values = _checked_params(route, params)
        if "node" in values and values["node"] != self.node:
            raise die(
                f"hostname lookup '{values['node']}' failed - failed to get address info for: {values['node']}: Name or service not known"
            )
        fault = self._take_api_fault(method, path)
        if fault is not None:
            raise fault
        _printed.lines = []
        try:
            out = getattr(self, "h_" + route.handler)(caller, values)
            res = out if isinstance(out, Result) else Result(out)
            res.stderr = _printed.lines
        finally:
            _printed.lines = []
        return res


_NO_SUCH_PROPERTY = "property is not defined in schema and the schema does not allow additional properties"


def _checked_params(route: Route, params: dict[str, Any]) -> dict[str, Any]:
    """The route's parameters checked as the API's JSONSchema does, and the guest config options
    a config route takes besides. Raises the API's 400 with every parameter's error."""
    values, errors = {}, {}
    for name, spec in route.params.items():
        if params.get(name) is None:  # JSONSchema check_prop: an undef value is a missing one
            if not spec.optional:
                errors[name] = "property is missing and it is not optional"
            continue
        try:
            values[name] = spec.fmt(params[name])
        except ItemErrors as e:
            errors.update({f"{name}[{i}]": msg for i, msg in e.by_index.items()})
        except ValueError as e:
            errors[name] = str(e)
    for name, value in params.items():
        if name in route.params or name == "_dc":
            continue
        if route.extra == "lxc":
            checked, why = _lxc_option(name, value)
        elif route.extra == "qemu":
            checked, why = _qemu_option(name, value)
        else:
            checked, why = None, _NO_SUCH_PROPERTY
        if why:
            errors[name] = why
        elif checked is not None:
            values[name] = checked
    if errors:
        raise param_error(errors)
    return values


def _lxc_option(name: str, value: Any) -> tuple[str | None, str | None]:
    """A container config option on the wire: (its value, None), (None, its error) or
    (None, None) for one the check skips."""
    if (
        value is None
        and re.match(r"^[a-z][a-z_]*\d*$", name)
        and not ((check_lxc_option(name, "") or "").startswith("unknown setting"))
    ):
        return None, None  # an undef value of an optional option: check_prop skips it
    why = check_lxc_option(name, str(value)) if re.match(r"^[a-z][a-z_]*\d*$", name) else "unknown setting"
    if why is None and name in BOOL_KEYS:
        try:  # the wire takes only 0/1 (JSONSchema check_type), the file parser more
            value = int(fmt_bool(value))
        except ValueError as e:
            why = str(e)
    if why and why.startswith("unknown setting"):
        return None, _NO_SUCH_PROPERTY
    if why:
        return None, why if why.startswith(("type check", "value ")) else f"invalid format - {why}\n"
    return str(value), None


def _qemu_option(name: str, value: Any) -> tuple[str | None, str | None]:
    """A VM config option on the wire: (its value, None) or (None, its error)."""
    if value is None and qemu_key_known(name):
        # an undef value (``affinity=`` on the wire) passes check_prop; update_vm_api
        # keeps the key and write_vm_config prints undef as an empty value
        return "", None
    why = qemu_param_problem(name, value)
    if why:
        return None, why
    return str(value), None
