"""Which driver a PCI function's native module binds it with, as modprobe resolves it.

The kernel names a device by its modalias (``MODALIAS=pci:v000010DEd00002BB5sv...bc03sc02i00`` in
its ``uevent``); ``modprobe`` looks the alias up in ``/lib/modules/<release>/modules.alias``
(globs written by depmod from each module's ``MODULE_DEVICE_TABLE``, see scripts/mod/file2alias.c)
and loads the modules it names; a loaded module's PCI drivers are the ``pci:<driver>`` links in
``/sys/module/<module>/drivers/``. This is how gputopo finds a function's native driver while it
sits on vfio-pci, so that it can be sent back there by name (``driver_override``) rather than by
probing, where a vfio-pci dynamic id (written by a VM start) would win.
"""

from __future__ import annotations

import fnmatch
import os
from functools import lru_cache

from gputopo.facts.files import list_dir, read_text, read_whole

# drivers that bind only what they are told to: never a function's native driver
NOT_NATIVE = frozenset({"vfio-pci", "pci-stub"})


def parse_modules_alias(text: str) -> list[tuple[str, str]]:
    """The PCI aliases of ``modules.alias`` text: [(glob, module)], in file order."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "alias" and parts[1].startswith("pci:"):
            out.append((parts[1], parts[2]))
    return out


def parse_uevent_modalias(text: str | None) -> str | None:
    """``MODALIAS=`` of a device's ``uevent`` text; None when absent."""
    for line in (text or "").splitlines():
        if line.startswith("MODALIAS="):
            return line[len("MODALIAS=") :].strip() or None
    return None


def modules_for(modalias: str, aliases: list[tuple[str, str]]) -> list[str]:
    """The modules whose alias globs match ``modalias``, in alias order, each once (as
    ``modprobe --resolve-alias`` lists them)."""
    out: list[str] = []
    for glob, module in aliases:
        if module not in out and fnmatch.fnmatchcase(modalias, glob):
            out.append(module)
    return out


@lru_cache(maxsize=8)
def _aliases(path: str, mtime: float) -> list[tuple[str, str]]:
    data = read_whole(path)  # bytes: modules.alias is a large file, read in one call
    return parse_modules_alias(data.decode("utf-8", "replace")) if data else []


def read_aliases(root: str) -> list[tuple[str, str]]:
    """The PCI aliases of the running kernel's ``modules.alias`` under ``root``; [] when absent."""
    release = (read_text(os.path.join(root, "proc/sys/kernel/osrelease")) or "").strip()
    path = os.path.join(root, "lib/modules", release, "modules.alias")
    try:
        mtime = os.stat(path).st_mtime
    except OSError:
        return []
    return _aliases(path, mtime)


def module_drivers(root: str, module: str) -> list[str]:
    """The PCI drivers a loaded module registered (``sys/module/<module>/drivers/pci:<name>``)."""
    names = list_dir(os.path.join(root, "sys/module", module, "drivers"))
    return sorted(n[4:] for n in names if n.startswith("pci:"))


def native_driver(root: str, address: str) -> str | None:
    """The driver a loaded module would bind the function at ``address`` with, resolved from its
    modalias; None when no loaded module claims it (or the alias data is missing)."""
    modalias = parse_uevent_modalias(read_text(os.path.join(root, "sys/bus/pci/devices", address, "uevent")))
    if modalias is None:
        return None
    for module in modules_for(modalias, read_aliases(root)):
        for drv in module_drivers(root, module):
            if drv not in NOT_NATIVE:
                return drv
    return None
