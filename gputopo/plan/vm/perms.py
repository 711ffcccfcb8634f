"""Which of the VM config keys gputopo writes only root@pam may change through the API. Pure.

qemu-server's ``update_vm_api`` (``src/PVE/API2/Qemu.pm``, ``$check_vm_modify_config_perm``:
line 995 of qemu-server 9.2.6, its option groups at lines 789-862, the die at line 1037) lets
root@pam change any key. Anyone else needs a privilege per option group (``numa`` and
``numaN`` are ``VM.Config.CPU``; a ``hostpciN`` naming a mapping needs ``Mapping.Use``), and a
key in no group dies ``only root can set '<key>' config`` (a 500), for a set and for a delete
alike. Of gputopo's keys, ``affinity``, ``args`` and ``hugepages`` are in no group. An API token
is never root@pam, not even one of root@pam: the API's user is then the token id
``root@pam!name`` (pve-manager ``PVE/HTTPServer.pm`` ``auth_handler``, line 86). A plan whose VM update
would change one of them with another login is refused here, before anything changes, rather
than failing at the config step with the switch half done.
"""

from __future__ import annotations

import shlex

from gputopo.plan.findings import Findings

ROOT_ONLY = frozenset({"affinity", "args", "hugepages"})


def root_only_keys(keys: list[str] | set[str]) -> list[str]:
    """The keys of ``keys`` only root@pam may set or delete through the API, sorted."""
    return sorted(k for k in keys if k in ROOT_ONLY)


def _without(vmid: int, keys: list[str], sets: dict[str, str]) -> str:
    """How the spec (or root, once) takes each of ``keys`` out of gputopo's update."""
    ways = []
    if "affinity" in keys:
        ways.append("affinity: false")
    if "hugepages" in keys:
        ways.append("hugepages unset")
    if "args" in keys:
        ways.append(
            f"args set once by root@pam (qm set {vmid} --args {shlex.quote(sets['args'])})"
            if "args" in sets
            else ""
        )
    return "; ".join(w for w in ways if w)


def check_writer(
    vmid: int, sets: dict[str, str], deletes: list[str], api_user: str | None, found: Findings
) -> None:
    """Refuse (or, when who applies is not known, warn about) VM ``vmid``'s update of a key only
    root@pam may change, when ``api_user`` is not root@pam."""
    keys = root_only_keys({*sets, *deletes})
    if not keys or api_user == "root@pam":
        return
    names = ", ".join(keys)
    if api_user is None:
        found.warn(
            f"VM {vmid}: only root@pam may set {names} through the Proxmox API (an API token may not, "
            "not even one of root@pam); this state was not read through the API, so who will apply "
            "the plan is not known: apply as root@pam with a password or with --local"
        )
        return
    who = f"API token {api_user}" if "!" in api_user else f"user {api_user}"
    fix = _without(vmid, keys, sets)
    found.refuse(
        None,
        f"VM {vmid}: {who} may not set {names} (qemu-server: only root can set '{keys[0]}' config): "
        "log in as root@pam with a password (GPUTOPO_PVE_PASSWORD), run with --local on the node, or use a "
        f"spec without {'them' if len(keys) > 1 else 'it'}" + (f" ({fix})" if fix else ""),
        "vm-root-only",
    )
