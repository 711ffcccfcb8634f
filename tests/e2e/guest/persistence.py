"""Boot persistence in the e2e guest: gputopo's rendered files, read by real kmod and real udevd.

The stand-in pair is two identical e1000 cards (8086:100e, see harness.py): the ``e1000`` module
plays nvidia. The hook and the rule name only a module and addresses, and the kernel paths they
rely on (``driver_override`` matching, driver registration, probe at device add) are the same for
every PCI driver; the guest's display stand-ins cannot serve here because their module (bochs)
drives other devices the earlier checks use.

Real parts: gputopo renders the files (``persistence_files`` with ``driver="e1000"``) into the
guest's ``/etc``; ``/sbin/modprobe`` becomes the host's kmod (the hook itself calls
``/sbin/modprobe``); Debian's ``systemd-udevd`` runs with Debian's rules from the shared ``/usr``
plus the rendered one in ``/etc/udev/rules.d``. Both come from the host's ``/usr`` share, like
the interpreter; the host passes their paths in ``GPUTOPO_E2E_KMOD``, ``GPUTOPO_E2E_UDEVD`` and
``GPUTOPO_E2E_UDEVADM``.

Steps, each recording ``address -> [driver, driver_override]`` of both cards:

* ``coldplug``: what a boot does once the stand-in is not loaded: the modules of the rendered
  modules-load.d file are loaded (systemd-modules-load), then udev replays the cards' add events
  (systemd-udev-trigger); Debian's 80-drivers.rules loads the driver by modalias.
* ``modprobe``: the driver's first load by name, ``modprobe e1000``.
* ``rescan``: both cards removed, ``/sys/bus/pci/rescan``.
* ``rescan_udev_late``: the same with udev's queue held until the rescan returned. The kernel
  sends the add uevent before it probes (pci_device_add, then pci_bus_add_device) and does not
  wait for udev, so udev may come second; in this guest it did once in six plain rescans.
  Holding the queue makes that order certain instead of occasional.
"""

from __future__ import annotations

import os
import subprocess
import time

SYS_PCI = "/sys/bus/pci/devices"
STAND_IN = ("0x8086", "0x100e")  # e1000 (82540EM), QEMU's "e1000"
DRIVER = "e1000"
SETTLE_S = "30"


def _rd(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def twins() -> list[str]:
    """The stand-in cards' addresses, sorted: the first is pinned, the second its twin."""
    return sorted(
        a
        for a in os.listdir(SYS_PCI)
        if (_rd(f"{SYS_PCI}/{a}/vendor"), _rd(f"{SYS_PCI}/{a}/device")) == STAND_IN
    )


def state(addrs: list[str]) -> dict[str, list]:
    """address -> [bound driver or None, driver_override text or None]."""
    out = {}
    for a in addrs:
        try:
            drv = os.path.basename(os.readlink(f"{SYS_PCI}/{a}/driver"))
        except OSError:
            drv = None
        out[a] = [drv, _rd(f"{SYS_PCI}/{a}/driver_override")]
    return out


class Tools:
    """kmod and udev from the host's /usr, each run under the name it dispatches on."""

    def __init__(self, log: list) -> None:
        self.kmod_path = os.environ.get("GPUTOPO_E2E_KMOD")
        self.udevd_path = os.environ.get("GPUTOPO_E2E_UDEVD")
        self.udevadm_path = os.environ.get("GPUTOPO_E2E_UDEVADM")
        self.log = log

    def missing(self) -> str | None:
        for env, path in (
            ("GPUTOPO_E2E_KMOD", self.kmod_path),
            ("GPUTOPO_E2E_UDEVD", self.udevd_path),
            ("GPUTOPO_E2E_UDEVADM", self.udevadm_path),
        ):
            if not path or not os.access(path, os.X_OK):
                return f"{env}={path!r}: no such program in the guest (install kmod and udev on the host)"
        return None

    def run(self, exe: str, name: str, *args: str) -> subprocess.CompletedProcess:
        p = subprocess.run([name, *args], executable=exe, capture_output=True, text=True, timeout=120)
        self.log.append(
            {"argv": [name, *args], "rc": p.returncode, "out": (p.stdout + p.stderr).strip()[-2000:]}
        )
        return p

    def modprobe(self, *args: str) -> subprocess.CompletedProcess:
        return self.run("/sbin/modprobe", "modprobe", *args)

    def rmmod(self, module: str) -> subprocess.CompletedProcess:
        return self.run(self.kmod_path, "rmmod", module)

    def udevadm(self, *args: str) -> subprocess.CompletedProcess:
        return self.run(self.udevadm_path, "udevadm", *args)

    def settle(self) -> None:
        self.udevadm("settle", "-t", SETTLE_S)


def _unload(tools: Tools, addrs: list[str]) -> None:
    """Back to "the stand-in driver never loaded": module out, cards unbound, no overrides."""
    tools.rmmod(DRIVER)  # rmmod, not modprobe -r: that would take the softdep's vfio-pci along
    for a in addrs:
        if os.path.exists(f"{SYS_PCI}/{a}/driver"):
            _write(f"{SYS_PCI}/{a}/driver/unbind", a)
        _write(f"{SYS_PCI}/{a}/driver_override", "\n")
    tools.settle()


def _rescan(tools: Tools, addrs: list[str], hold_udev: bool) -> dict:
    for a in addrs:
        _write(f"{SYS_PCI}/{a}/remove", "1")
    tools.settle()
    if hold_udev:
        tools.udevadm("control", "--stop-exec-queue")
    t0 = time.monotonic()
    _write("/sys/bus/pci/rescan", "1")
    res = {"rescan_s": round(time.monotonic() - t0, 2)}
    if hold_udev:
        res["kernel"] = state(addrs)  # what the kernel chose before udev saw the add events
        tools.udevadm("control", "--start-exec-queue")
    tools.settle()
    res["after"] = state(addrs)
    return res


def check_persistence(out: str) -> dict:
    """Render the persistence files for the first stand-in card, install them, and record where
    both cards end after a boot's coldplug, a modprobe and PCI rescans (see the module doc)."""
    from gputopo.plan.render import MODULES_PATH, persistence_files

    log: list = []
    tools = Tools(log)
    why = tools.missing()
    if why:
        return {"unavailable": why}
    addrs = twins()
    if len(addrs) != 2:
        return {"unavailable": f"want two {STAND_IN} cards, the guest has {addrs}"}
    pinned, twin = addrs
    obs: dict = {"pinned": pinned, "twin": twin, "driver": DRIVER, "boot": state(addrs), "log": log}
    files = persistence_files([pinned], driver=DRIVER)
    for rel, text in files.items():
        os.makedirs(os.path.dirname(f"/{rel}"), exist_ok=True)
        _write(f"/{rel}", text)
    obs["files"] = files
    # the hook runs /sbin/modprobe: in this guest that is busybox until it points at kmod
    os.replace(_symlink(tools.kmod_path, "/sbin/.modprobe.new"), "/sbin/modprobe")
    try:
        obs["kmod_config"] = [
            l
            for l in tools.modprobe("--show-config").stdout.splitlines()
            if l.split()[:2] in (["install", DRIVER], ["softdep", DRIVER])
        ]
        obs["udevd"] = tools.run(
            tools.udevd_path, "systemd-udevd", "--daemon", "--resolve-names=never"
        ).returncode
        obs["steps"] = steps = {}
        t0 = time.monotonic()
        _unload(tools, addrs)
        modules = [l.strip() for l in files[MODULES_PATH].splitlines() if l.strip() and not l.startswith("#")]
        tools.modprobe("-a", *modules)  # what systemd-modules-load does with the file
        tools.udevadm("trigger", "--action=add", *(f"{SYS_PCI}/{a}" for a in addrs))
        tools.settle()
        steps["coldplug"] = state(addrs)
        _unload(tools, addrs)
        obs["modprobe_rc"] = tools.modprobe(DRIVER).returncode
        tools.settle()
        steps["modprobe"] = state(addrs)
        steps["rescan"] = _rescan(tools, addrs, hold_udev=False)
        steps["rescan_udev_late"] = _rescan(tools, addrs, hold_udev=True)
        obs["steps_s"] = round(time.monotonic() - t0, 1)
    finally:
        tools.udevadm("control", "--exit")
        os.replace(_symlink("../bin/busybox", "/sbin/.modprobe.old"), "/sbin/modprobe")
    return obs


def _symlink(target: str, path: str) -> str:
    if os.path.lexists(path):
        os.unlink(path)
    os.symlink(target, path)
    return path
