"""The kernel's PCI bind rules as scenarios that run against any backend.

Each ``scenario_*`` function takes a :class:`KernelBackend` (writes through a SysfsPort, reads
the tree under ``root``) and asserts what can be observed after every step. They hold for the
simulated kernel (``gputopo.sim.kernel.SimKernel`` on a fixture tree) and for a real Linux
kernel (``gputopo.adapters.sysfs.RealSysfs("/")`` in a QEMU guest whose "GPU" is a bochs-display with an
HD-audio companion in one IOMMU group), so nothing here depends on the nvidia driver or on
anything only the simulator does. Every scenario puts the devices back on their native
drivers when it ends, so they can run one after another on one machine.

:data:`CONFORMANCE_STEPS` is one scripted sequence and :func:`run_conformance` returns what was
observed after each step, in a backend-neutral form, so two backends can be compared step by
step.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass

from gputopo.errors import SysfsWriteError
from gputopo.ports import SysfsPort

VFIO = "vfio-pci"


@dataclass
class KernelBackend:
    """The machine the scenarios run on and the devices they may use.

    ``gpu`` is a display function on its native driver ``gpu_driver`` that shares an IOMMU
    group with ``gpu_companion`` (on ``companion_driver``); ``other_gpu`` has the same
    vendor:device as ``gpu``, sits in another group and is on ``gpu_driver`` too;
    ``unbound_device`` (optional) is a function no loaded driver matches. vfio-pci is loaded;
    ``missing_driver`` is not; ``absent_address`` names no device.
    """

    port: SysfsPort
    root: str
    gpu: str
    gpu_driver: str
    gpu_companion: str
    companion_driver: str
    other_gpu: str
    unbound_device: str | None = None
    missing_driver: str = "gputopo_not_loaded"
    absent_address: str = "0000:7e:1f.7"


# --- observing ------------------------------------------------------------------------------


def write(b: KernelBackend, path: str, value: str) -> str:
    """Write through the backend's port; ``"ok"`` or the errno's name (``"ENODEV"``)."""
    try:
        b.port.write(path, value)
    except SysfsWriteError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
    return "ok"


def _p(b: KernelBackend, rel: str) -> str:
    return os.path.join(b.root, rel)


def dev(addr: str, attr: str = "") -> str:
    return f"sys/bus/pci/devices/{addr}" + (f"/{attr}" if attr else "")


def driver(b: KernelBackend, addr: str) -> str | None:
    try:
        return os.path.basename(os.readlink(_p(b, dev(addr, "driver"))))
    except OSError:
        return None


def override_text(b: KernelBackend, addr: str) -> str:
    with open(_p(b, dev(addr, "driver_override"))) as f:
        return f.read()


def backlink(b: KernelBackend, drv: str, addr: str) -> bool:
    return os.path.lexists(_p(b, f"sys/bus/pci/drivers/{drv}/{addr}"))


def group(b: KernelBackend, addr: str) -> str:
    return os.path.basename(os.readlink(_p(b, dev(addr, "iommu_group"))))


def vfio_node(b: KernelBackend, addr: str) -> bool:
    return os.path.exists(_p(b, f"dev/vfio/{group(b, addr)}"))


def ids(b: KernelBackend, addr: str) -> tuple[str, str]:
    def attr(name: str) -> str:
        with open(_p(b, dev(addr, name))) as f:
            return f.read().strip().removeprefix("0x")

    return attr("vendor"), attr("device")


def unbind(b: KernelBackend, addr: str) -> str:
    drv = driver(b, addr)
    return write(b, f"sys/bus/pci/drivers/{drv}/unbind", addr) if drv else "unbound"


def to_vfio(b: KernelBackend, addr: str) -> None:
    """Move one function to vfio-pci the override way and check it landed."""
    assert write(b, dev(addr, "driver_override"), VFIO) == "ok"
    unbind(b, addr)
    assert write(b, "sys/bus/pci/drivers_probe", addr) == "ok"
    assert driver(b, addr) == VFIO
    assert backlink(b, VFIO, addr)


def to_native(b: KernelBackend, addr: str, native: str) -> None:
    """Clear the override and let the native driver claim the function again."""
    assert write(b, dev(addr, "driver_override"), "\n") == "ok"
    if driver(b, addr) != native:
        unbind(b, addr)
        assert write(b, "sys/bus/pci/drivers_probe", addr) == "ok"
    assert driver(b, addr) == native, f"{addr} on {driver(b, addr)}, not {native}"


def restore(b: KernelBackend) -> None:
    """Every device the scenarios use back on its native driver, no override, no dynamic id."""
    vendor, device = ids(b, b.gpu)
    write(b, f"sys/bus/pci/drivers/{VFIO}/remove_id", f"{vendor} {device}")
    for addr, native in (
        (b.gpu, b.gpu_driver),
        (b.gpu_companion, b.companion_driver),
        (b.other_gpu, b.gpu_driver),
    ):
        write(b, dev(addr, "driver_override"), "\n")
        if driver(b, addr) != native:
            unbind(b, addr)
            write(b, "sys/bus/pci/drivers_probe", addr)
        if driver(b, addr) != native:
            write(b, f"sys/bus/pci/drivers/{native}/bind", addr)
    if b.unbound_device:
        write(b, dev(b.unbound_device, "driver_override"), "\n")
        unbind(b, b.unbound_device)


# --- scenarios --------------------------------------------------------------------------------


def scenario_override_set_and_clear(b: KernelBackend) -> None:
    """A name sets driver_override and reads back with a newline; "\\n" clears it to (null).
    Setting it does not move a bound device."""
    assert override_text(b, b.gpu) == "(null)\n"
    assert write(b, dev(b.gpu, "driver_override"), VFIO) == "ok"
    assert override_text(b, b.gpu) == "vfio-pci\n"
    assert driver(b, b.gpu) == b.gpu_driver
    assert write(b, dev(b.gpu, "driver_override"), f"{VFIO}\n") == "ok"
    assert override_text(b, b.gpu) == "vfio-pci\n"
    assert write(b, dev(b.gpu, "driver_override"), "\n") == "ok"
    assert override_text(b, b.gpu) == "(null)\n"
    restore(b)


def scenario_empty_write_changes_nothing(b: KernelBackend) -> None:
    """A zero-length write never reaches the attribute: the override stays."""
    try:
        assert write(b, dev(b.gpu, "driver_override"), VFIO) == "ok"
        assert write(b, dev(b.gpu, "driver_override"), "") == "ok"
        assert override_text(b, b.gpu) == "vfio-pci\n"
    finally:
        restore(b)


def scenario_override_wins_over_id_table(b: KernelBackend) -> None:
    """With an override only the named driver may bind: the native driver's bind is ENODEV,
    drivers_probe picks the override."""
    try:
        assert write(b, dev(b.gpu, "driver_override"), VFIO) == "ok"
        assert write(b, f"sys/bus/pci/drivers/{b.gpu_driver}/unbind", b.gpu) == "ok"
        assert driver(b, b.gpu) is None
        assert not backlink(b, b.gpu_driver, b.gpu)
        assert write(b, f"sys/bus/pci/drivers/{b.gpu_driver}/bind", b.gpu) == "ENODEV"
        assert driver(b, b.gpu) is None
        assert write(b, "sys/bus/pci/drivers_probe", b.gpu) == "ok"
        assert driver(b, b.gpu) == VFIO
        assert backlink(b, VFIO, b.gpu)
        assert vfio_node(b, b.gpu)
    finally:
        restore(b)
    assert driver(b, b.gpu) == b.gpu_driver


def scenario_unbind_rules(b: KernelBackend) -> None:
    """unbind: ENODEV from a driver the device is not on; the driver/unbind path form works;
    a second unbind is ENODEV (by driver) or ENOENT (no driver link to follow)."""
    try:
        assert write(b, f"sys/bus/pci/drivers/{VFIO}/unbind", b.gpu) == "ENODEV"
        assert driver(b, b.gpu) == b.gpu_driver
        assert write(b, dev(b.gpu, "driver/unbind"), b.gpu) == "ok"
        assert driver(b, b.gpu) is None
        assert not backlink(b, b.gpu_driver, b.gpu)
        assert write(b, f"sys/bus/pci/drivers/{b.gpu_driver}/unbind", b.gpu) == "ENODEV"
        assert write(b, dev(b.gpu, "driver/unbind"), b.gpu) == "ENOENT"
    finally:
        restore(b)


def scenario_bind_rules(b: KernelBackend) -> None:
    """bind: EBUSY on a bound device; ENODEV for a driver that does not match (vfio-pci has no
    ids of its own); a matching driver binds; ENOENT for a driver that is not loaded."""
    try:
        assert write(b, f"sys/bus/pci/drivers/{b.gpu_driver}/bind", b.gpu) == "EBUSY"
        assert unbind(b, b.gpu) == "ok"
        assert write(b, f"sys/bus/pci/drivers/{VFIO}/bind", b.gpu) == "ENODEV"
        assert driver(b, b.gpu) is None
        assert write(b, f"sys/bus/pci/drivers/{b.missing_driver}/bind", b.gpu) == "ENOENT"
        assert write(b, f"sys/bus/pci/drivers/{b.gpu_driver}/bind", b.gpu) == "ok"
        assert driver(b, b.gpu) == b.gpu_driver
        assert backlink(b, b.gpu_driver, b.gpu)
    finally:
        restore(b)


def scenario_drivers_probe_rules(b: KernelBackend) -> None:
    """drivers_probe: a bound device stays where it is; an unbound one goes to the driver that
    matches; ENODEV for an address that does not exist."""
    try:
        assert write(b, "sys/bus/pci/drivers_probe", b.gpu) == "ok"
        assert driver(b, b.gpu) == b.gpu_driver
        assert unbind(b, b.gpu) == "ok"
        assert write(b, "sys/bus/pci/drivers_probe", f"{b.gpu}\n") == "ok"
        assert driver(b, b.gpu) == b.gpu_driver
        assert write(b, "sys/bus/pci/drivers_probe", b.absent_address) == "ENODEV"
    finally:
        restore(b)


def scenario_probe_without_match_succeeds(b: KernelBackend) -> None:
    """drivers_probe reports success for a device no driver matches, and binds nothing."""
    if not b.unbound_device:
        return
    assert driver(b, b.unbound_device) is None
    assert write(b, "sys/bus/pci/drivers_probe", b.unbound_device) == "ok"
    assert driver(b, b.unbound_device) is None


def scenario_absent_address(b: KernelBackend) -> None:
    """An address with no device: bind/unbind/drivers_probe ENODEV; its attributes ENOENT."""
    a = b.absent_address
    assert write(b, f"sys/bus/pci/drivers/{b.gpu_driver}/bind", a) == "ENODEV"
    assert write(b, f"sys/bus/pci/drivers/{b.gpu_driver}/unbind", a) == "ENODEV"
    assert write(b, "sys/bus/pci/drivers_probe", a) == "ENODEV"
    assert write(b, dev(a, "driver_override"), VFIO) == "ENOENT"
    assert write(b, "sys/bus/pci/drivers_probe", b.gpu[5:]) == "ENODEV"  # short form: no match


def scenario_new_id_grabs_every_unbound_match(b: KernelBackend) -> None:
    """new_id claims EVERY unbound device with that id at once (the reason to use overrides);
    the same id again is EEXIST; remove_id does not unbind; a second remove_id is ENODEV."""
    vendor, device = ids(b, b.gpu)
    assert ids(b, b.other_gpu) == (vendor, device)
    try:
        assert unbind(b, b.gpu) == "ok"
        assert unbind(b, b.other_gpu) == "ok"
        assert write(b, f"sys/bus/pci/drivers/{VFIO}/new_id", "zz") == "EINVAL"
        assert write(b, f"sys/bus/pci/drivers/{VFIO}/new_id", f"{vendor} {device}") == "ok"
        assert driver(b, b.gpu) == VFIO
        assert driver(b, b.other_gpu) == VFIO
        assert driver(b, b.gpu_companion) == b.companion_driver
        assert write(b, f"sys/bus/pci/drivers/{VFIO}/new_id", f"{vendor} {device}") == "EEXIST"
        assert write(b, f"sys/bus/pci/drivers/{VFIO}/remove_id", f"{vendor} {device}") == "ok"
        assert driver(b, b.gpu) == VFIO
        assert write(b, f"sys/bus/pci/drivers/{VFIO}/remove_id", f"{vendor} {device}") == "ENODEV"
    finally:
        restore(b)
    assert driver(b, b.gpu) == b.gpu_driver
    assert driver(b, b.other_gpu) == b.gpu_driver


def scenario_new_id_leaves_bound_devices(b: KernelBackend) -> None:
    """new_id only probes unbound devices: a bound one with the same id stays put."""
    vendor, device = ids(b, b.gpu)
    try:
        assert unbind(b, b.gpu) == "ok"
        assert write(b, f"sys/bus/pci/drivers/{VFIO}/new_id", f"{vendor} {device}") == "ok"
        assert driver(b, b.gpu) == VFIO
        assert driver(b, b.other_gpu) == b.gpu_driver
    finally:
        restore(b)


def scenario_override_beats_new_id(b: KernelBackend) -> None:
    """A device whose override names another driver is not claimed by new_id."""
    vendor, device = ids(b, b.gpu)
    try:
        assert write(b, dev(b.other_gpu, "driver_override"), b.gpu_driver) == "ok"
        assert unbind(b, b.gpu) == "ok"
        assert unbind(b, b.other_gpu) == "ok"
        assert write(b, f"sys/bus/pci/drivers/{VFIO}/new_id", f"{vendor} {device}") == "ok"
        assert driver(b, b.gpu) == VFIO
        assert driver(b, b.other_gpu) is None
    finally:
        restore(b)


def scenario_vfio_group_node_follows_members(b: KernelBackend) -> None:
    """dev/vfio/<group> exists while ANY member of the group is on vfio-pci."""
    assert group(b, b.gpu) == group(b, b.gpu_companion)
    assert not vfio_node(b, b.gpu)
    try:
        to_vfio(b, b.gpu)
        assert vfio_node(b, b.gpu)
        to_vfio(b, b.gpu_companion)
        assert vfio_node(b, b.gpu)
        to_native(b, b.gpu, b.gpu_driver)
        assert vfio_node(b, b.gpu)
        to_native(b, b.gpu_companion, b.companion_driver)
        assert not vfio_node(b, b.gpu)
    finally:
        restore(b)


SCENARIOS: list[Callable[[KernelBackend], None]] = [
    scenario_override_set_and_clear,
    scenario_empty_write_changes_nothing,
    scenario_override_wins_over_id_table,
    scenario_unbind_rules,
    scenario_bind_rules,
    scenario_drivers_probe_rules,
    scenario_probe_without_match_succeeds,
    scenario_absent_address,
    scenario_new_id_grabs_every_unbound_match,
    scenario_new_id_leaves_bound_devices,
    scenario_override_beats_new_id,
    scenario_vfio_group_node_follows_members,
]


# --- conformance ------------------------------------------------------------------------------


def _step(path: Callable[[KernelBackend], str], value: Callable[[KernelBackend], str]):
    return lambda b: write(b, path(b), value(b))


CONFORMANCE_STEPS: list[tuple[str, Callable[[KernelBackend], str]]] = [
    ("override", _step(lambda b: dev(b.gpu, "driver_override"), lambda b: VFIO)),
    ("probe-while-bound", _step(lambda b: "sys/bus/pci/drivers_probe", lambda b: b.gpu)),
    ("unbind", _step(lambda b: f"sys/bus/pci/drivers/{b.gpu_driver}/unbind", lambda b: b.gpu)),
    (
        "bind-native-despite-override",
        _step(lambda b: f"sys/bus/pci/drivers/{b.gpu_driver}/bind", lambda b: b.gpu),
    ),
    ("probe", _step(lambda b: "sys/bus/pci/drivers_probe", lambda b: b.gpu)),
    ("bind-while-bound", _step(lambda b: f"sys/bus/pci/drivers/{VFIO}/bind", lambda b: b.gpu)),
    ("unbind-via-driver-link", _step(lambda b: dev(b.gpu, "driver/unbind"), lambda b: b.gpu)),
    ("clear", _step(lambda b: dev(b.gpu, "driver_override"), lambda b: "\n")),
    ("unbind-unbound", _step(lambda b: f"sys/bus/pci/drivers/{b.gpu_driver}/unbind", lambda b: b.gpu)),
    ("unbind-unbound-via-driver-link", _step(lambda b: dev(b.gpu, "driver/unbind"), lambda b: b.gpu)),
    ("bind-vfio-without-override", _step(lambda b: f"sys/bus/pci/drivers/{VFIO}/bind", lambda b: b.gpu)),
    ("bind", _step(lambda b: f"sys/bus/pci/drivers/{b.gpu_driver}/bind", lambda b: b.gpu)),
    (
        "bind-not-loaded-driver",
        _step(lambda b: f"sys/bus/pci/drivers/{b.missing_driver}/bind", lambda b: b.gpu),
    ),
    (
        "bind-nonexistent-address",
        _step(lambda b: f"sys/bus/pci/drivers/{b.gpu_driver}/bind", lambda b: b.absent_address),
    ),
    ("probe-nonexistent-address", _step(lambda b: "sys/bus/pci/drivers_probe", lambda b: b.absent_address)),
    (
        "override-nonexistent-address",
        _step(lambda b: dev(b.absent_address, "driver_override"), lambda b: VFIO),
    ),
]


def observe(b: KernelBackend) -> dict[str, object]:
    """What both backends can show, with backend-specific names replaced by roles."""
    names = {b.gpu_driver: "<gpu-native>", b.companion_driver: "<companion-native>"}
    state: dict[str, object] = {}
    for role, addr in (("gpu", b.gpu), ("gpu_companion", b.gpu_companion), ("other_gpu", b.other_gpu)):
        drv = driver(b, addr)
        state[f"{role}.driver"] = names.get(drv, drv) if drv else None
        text = override_text(b, addr).strip()
        state[f"{role}.override"] = names.get(text, text)
        state[f"{role}.vfio_backlink"] = backlink(b, VFIO, addr)
    state["gpu.group_node"] = vfio_node(b, b.gpu)
    return state


def run_conformance(b: KernelBackend) -> list[tuple[str, dict[str, object]]]:
    """Run :data:`CONFORMANCE_STEPS` from a restored start; return ``(step, state)`` per step,
    where state holds the write's ``result`` ("ok" or an errno name) and :func:`observe`."""
    restore(b)
    out: list[tuple[str, dict[str, object]]] = [("start", {"result": "ok", **observe(b)})]
    try:
        for name, step in CONFORMANCE_STEPS:
            result = step(b)
            out.append((name, {"result": result, **observe(b)}))
    finally:
        restore(b)
    return out
