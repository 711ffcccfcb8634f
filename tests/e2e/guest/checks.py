"""Runs inside the e2e guest against the real ``/sys``; writes what it saw to ``<out>/results.json``.

Each check records observations (raw sysfs readings, what gputopo returned or raised); the
host-side tests judge them. A check that raises is recorded with its traceback, and the file
is rewritten after every check so a crash later on keeps earlier results.

The independent reader here uses nothing of gputopo's: plain ``os`` calls on ``/sys``.

usage: checks.py OUT_DIR [CHECK...]
"""

from __future__ import annotations

import dataclasses
import enum
import errno
import fcntl
import json
import os
import struct
import sys
import time
import traceback

SYS_PCI = "/sys/bus/pci/devices"
GROUPS = "/sys/kernel/iommu_groups"
NODES = "/sys/devices/system/node"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
GPU_MATCH = "0x1234:0x03"  # stand-in: the emulated display devices count as GPUs
BIND_TIMEOUT = 20.0

# --- independent sysfs reader ----------------------------------------------------------


def rd(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def link_name(path: str) -> str | None:
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def pci_table() -> dict[str, dict]:
    """Every PCI device as sysfs shows it, keyed by address."""
    out = {}
    for a in sorted(os.listdir(SYS_PCI)):
        d = f"{SYS_PCI}/{a}"
        out[a] = {
            "vendor": rd(f"{d}/vendor"),
            "device": rd(f"{d}/device"),
            "class": rd(f"{d}/class"),
            "subsystem_vendor": rd(f"{d}/subsystem_vendor"),
            "subsystem_device": rd(f"{d}/subsystem_device"),
            "numa_node": rd(f"{d}/numa_node"),
            "local_cpulist": rd(f"{d}/local_cpulist"),
            "iommu_group": link_name(f"{d}/iommu_group"),
            "driver": link_name(f"{d}/driver"),
            "driver_override": rd(f"{d}/driver_override"),
        }
    return out


def driver_table() -> dict[str, list]:
    """address -> [driver link, driver_override text]: the state a rollback must restore."""
    return {
        a: [link_name(f"{SYS_PCI}/{a}/driver"), rd(f"{SYS_PCI}/{a}/driver_override")]
        for a in sorted(os.listdir(SYS_PCI))
    }


def iommu_groups() -> dict[str, list[str]]:
    if not os.path.isdir(GROUPS):
        return {}
    return {g: sorted(os.listdir(f"{GROUPS}/{g}/devices")) for g in os.listdir(GROUPS)}


def node_cpus() -> dict[str, str | None]:
    return {
        n[4:]: rd(f"{NODES}/{n}/cpulist")
        for n in sorted(os.listdir(NODES))
        if n.startswith("node") and n[4:].isdigit()
    }


def raw_write(path: str, value: str) -> int:
    """Write like ``echo -n``; return 0 or the errno the kernel gave."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError as e:
        return e.errno
    try:
        os.write(fd, value.encode())
        return 0
    except OSError as e:
        return e.errno
    finally:
        os.close(fd)


# --- VFIO (linux/vfio.h): _IO(';', 100 + n) ----------------------------------------------

VFIO_GET_API_VERSION = 0x3B64
VFIO_CHECK_EXTENSION = 0x3B65
VFIO_SET_IOMMU = 0x3B66
VFIO_GROUP_GET_STATUS = 0x3B67
VFIO_GROUP_SET_CONTAINER = 0x3B68
VFIO_GROUP_UNSET_CONTAINER = 0x3B69
VFIO_GROUP_FLAGS_VIABLE = 1
VFIO_TYPE1v2_IOMMU = 3


def vfio_status(group: str) -> dict:
    """What QEMU would find: open the group, GROUP_GET_STATUS, try SET_CONTAINER + SET_IOMMU."""
    res: dict = {"node": os.path.exists(f"/dev/vfio/{group}")}
    try:
        g = os.open(f"/dev/vfio/{group}", os.O_RDWR)
    except OSError as e:
        res.update(open_errno=errno.errorcode.get(e.errno, e.errno), viable=False)
        return res
    try:
        buf = bytearray(struct.pack("II", 8, 0))
        fcntl.ioctl(g, VFIO_GROUP_GET_STATUS, buf)
        flags = struct.unpack("II", buf)[1]
        res.update(open_errno=None, flags=flags, viable=bool(flags & VFIO_GROUP_FLAGS_VIABLE))
        c = os.open("/dev/vfio/vfio", os.O_RDWR)
        try:
            fcntl.ioctl(g, VFIO_GROUP_SET_CONTAINER, struct.pack("i", c))
            fcntl.ioctl(c, VFIO_SET_IOMMU, VFIO_TYPE1v2_IOMMU)
            res["set_container"] = "ok"
            fcntl.ioctl(g, VFIO_GROUP_UNSET_CONTAINER)
        except OSError as e:
            res["set_container"] = errno.errorcode.get(e.errno, e.errno)
        finally:
            os.close(c)
    except OSError as e:
        res.update(status_errno=errno.errorcode.get(e.errno, e.errno), viable=False)
    finally:
        os.close(g)
    return res


# --- helpers ------------------------------------------------------------------------------


def jsonable(x):
    """Best-effort JSON form of whatever gputopo returns (models, dataclasses, enums)."""
    if hasattr(x, "model_dump"):
        return x.model_dump(mode="json", by_alias=True)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {k: jsonable(v) for k, v in dataclasses.asdict(x).items()}
    if isinstance(x, enum.Enum):
        return x.value
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set)):
        return [jsonable(v) for v in x]
    if x is None or isinstance(x, (str, int, float, bool)):
        return x
    return repr(x)


def caught(fn, *args, **kw) -> dict:
    """Call fn; return {"ok": value} or what it raised (class chain, errno, one-line text)."""
    try:
        return {"ok": jsonable(fn(*args, **kw))}
    except Exception as e:
        return {
            "raised": [c.__name__ for c in type(e).__mro__],
            "errno": getattr(e, "errno", None),
            "message": str(e),
            "module": type(e).__module__,
            "attrs": {
                k: jsonable(v)
                for k, v in vars(e).items()
                if k in ("path", "value", "address", "wanted", "got", "errno")
            },
        }


def gputopo_cli(*args: str) -> dict:
    """Run the ``gputopo`` command line in this process (a fresh interpreter costs seconds
    under TCG); returns its exit status and what it printed."""
    import contextlib
    import io

    from gputopo.cli import main as cli_main

    out, err = io.StringIO(), io.StringIO()
    rc = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli_main(list(args))
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return {"argv": list(args), "rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()}


def stand_in_pair(numa: str) -> tuple[str, str, str]:
    """(display fn .0, audio fn .1, iommu group) of the bochs-display + HDA card on ``numa``."""
    t = pci_table()
    for a, d in t.items():
        if (d["vendor"], d["device"], d["class"], d["numa_node"]) == ("0x1234", "0x1111", "0x038000", numa):
            audio = a[:-1] + "1"
            if audio in t:
                return a, audio, d["iommu_group"]
    raise LookupError(f"no bochs-display + audio pair on NUMA node {numa}")


def binder():
    from gputopo.adapters.sysfs import Binder, RealSysfs

    port = RealSysfs(root="/")
    return port, Binder(port, "/", BIND_TIMEOUT)


# --- checks ------------------------------------------------------------------------------


def check_discover(out: str) -> dict:
    """``gputopo discover --json --gpu-match`` next to an independent reading of /sys."""
    res = {"before": driver_table()}
    res |= gputopo_cli("discover", "--json", "--gpu-match", GPU_MATCH)
    res.update(
        table=pci_table(),
        groups=iommu_groups(),
        nodes=node_cpus(),
        vfio=sorted(os.listdir("/dev/vfio")) if os.path.isdir("/dev/vfio") else [],
    )
    return res


def check_snapshot(out: str) -> dict:
    """``gputopo snapshot`` of the untouched guest, right after discover saw the same state."""
    res = gputopo_cli("snapshot", f"{out}/snap.tar.gz")
    res["size"] = os.path.getsize(f"{out}/snap.tar.gz") if os.path.exists(f"{out}/snap.tar.gz") else None
    return res


def check_bind_pair(out: str) -> dict:
    """Move the NUMA-0 stand-in GPU + its audio function to vfio-pci as one group and back."""
    gpu, audio, group = stand_in_pair("0")
    port, b = binder()
    obs: dict = {
        "gpu": gpu,
        "audio": audio,
        "group": group,
        "members": iommu_groups().get(group),
        "before": driver_table(),
    }
    obs["to_vfio"] = caught(b.move_group, [gpu, audio], "vfio-pci", True)
    obs["on_vfio"] = {
        "links": {a: link_name(f"{SYS_PCI}/{a}/driver") for a in (gpu, audio)},
        "overrides": {a: rd(f"{SYS_PCI}/{a}/driver_override") for a in (gpu, audio)},
        "driver_of": {a: caught(b.driver_of, a) for a in (gpu, audio)},
        "group_state": caught(b.group_state, int(group)),
        "vfio_group_present": caught(b.vfio_group_present, int(group)),
        "dev_vfio": os.path.exists(f"/dev/vfio/{group}"),
        "vfio": vfio_status(group),
    }
    obs["back_gpu"] = caught(b.move, gpu, "bochs-drm", False)
    obs["back_audio"] = caught(b.move, audio, "snd_hda_intel", False)
    obs["native"] = {
        "links": {a: link_name(f"{SYS_PCI}/{a}/driver") for a in (gpu, audio)},
        "vfio_group_present": caught(b.vfio_group_present, int(group)),
        "dev_vfio": os.path.exists(f"/dev/vfio/{group}"),
    }
    # Half a group on vfio-pci: the kernel must refuse to hand the group to a VM.
    obs["half"] = {"move": caught(b.move, gpu, "vfio-pci", False)}
    obs["half"].update(
        links={a: link_name(f"{SYS_PCI}/{a}/driver") for a in (gpu, audio)},
        group_state=caught(b.group_state, int(group)),
        vfio_group_present=caught(b.vfio_group_present, int(group)),
        vfio=vfio_status(group),
    )
    obs["half_back"] = caught(b.move, gpu, "bochs-drm", False)
    obs["after"] = driver_table()
    return obs


def check_failures(out: str) -> dict:
    """Errors the kernel really produces, through RealSysfs/Binder and through plain writes."""
    port, b = binder()
    t = pci_table()
    nic = next(a for a, d in t.items() if d["subsystem_vendor"] == "0x10de")  # e1000e, NUMA 1
    edu = next(a for a, d in t.items() if (d["vendor"], d["device"]) == ("0x1234", "0x11e8"))
    ghost = "0000:99:1f.7"
    obs: dict = {"nic": nic, "edu": edu, "ghost": ghost, "before": driver_table()}
    cases = {
        # driver that is not loaded: its bind file does not exist
        "bind_unloaded": ("sys/bus/pci/drivers/nvidia/bind", nic),
        # address that does not exist, to a driver that is loaded
        "bind_ghost": ("sys/bus/pci/drivers/vfio-pci/bind", ghost),
        "override_ghost": (f"sys/bus/pci/devices/{ghost}/driver_override", "vfio-pci"),
        "probe_ghost": ("sys/bus/pci/drivers_probe", ghost),
        # unbind of a device that has no driver / is not bound to that driver
        "unbind_unbound": ("sys/bus/pci/drivers/vfio-pci/unbind", edu),
        "unbind_other": ("sys/bus/pci/drivers/vfio-pci/unbind", nic),
        # bind to a loaded driver that does not claim the device (no override, no id)
        "bind_unclaimed": ("sys/bus/pci/drivers/vfio-pci/bind", edu),
    }
    for name, (path, value) in cases.items():
        obs[name] = {"path": path, "value": value, "kernel_errno": None, "port": None}
    for name, (path, value) in cases.items():
        obs[name]["port"] = caught(port.write, path, value)
        obs[name]["kernel_errno"] = errno.errorcode.get(raw_write("/" + path, value))
    obs["after_writes"] = driver_table()
    obs["move_unloaded"] = caught(b.move, nic, "nvidia", False)
    obs["move_unloaded_state"] = {
        "driver": link_name(f"{SYS_PCI}/{nic}/driver"),
        "override": rd(f"{SYS_PCI}/{nic}/driver_override"),
    }
    obs["move_unloaded_restore"] = caught(b.move, nic, "e1000e", False)
    obs["move_ghost"] = caught(b.move, ghost, "vfio-pci", False)
    obs["after"] = driver_table()
    return obs


def check_rollback(out: str) -> dict:
    """move_group, then undo it from the previous state it returned: back to the start table."""
    gpu, audio, group = stand_in_pair("1")
    port, b = binder()
    obs: dict = {"gpu": gpu, "audio": audio, "group": group, "before": driver_table()}
    try:
        prev = b.move_group([gpu, audio], "vfio-pci", True)
    except Exception:
        obs["move_group"] = {"raised": traceback.format_exc()}
        return obs
    obs["move_group"] = {"ok": jsonable(prev)}
    obs["moved"] = driver_table()
    obs["undo"] = caught(undo_move_group, b, prev)
    obs["after"] = driver_table()
    return obs


def undo_move_group(b, prev):
    """Undo a move_group from the previous state it returned, the way apply's rollback does."""
    return b.restore(prev)


def scenario_roles() -> dict:
    """The devices kernel_scenarios may use on this machine, by role."""
    gpu, audio, _ = stand_in_pair("0")
    other, _, _ = stand_in_pair("1")
    edu = next(a for a, d in pci_table().items() if (d["vendor"], d["device"]) == ("0x1234", "0x11e8"))
    return {
        "gpu": gpu,
        "gpu_driver": "bochs-drm",
        "gpu_companion": audio,
        "companion_driver": "snd_hda_intel",
        "other_gpu": other,
        "unbound_device": edu,
    }


def _kernel_scenarios():
    sys.path.insert(0, os.path.join(REPO, "tests"))
    from helpers import kernel_scenarios

    return kernel_scenarios


def check_conformance(out: str) -> dict:
    """kernel_scenarios' sequence against the real kernel (the host replays it on the start
    snapshot; ``before`` shows the guest is still in that state)."""
    roles = scenario_roles()
    res: dict = {"roles": roles, "before": driver_table()}
    from gputopo.adapters.sysfs import RealSysfs

    ks = _kernel_scenarios()
    backend = ks.KernelBackend(port=RealSysfs("/"), root="/", **roles)
    res["steps"] = [[name, jsonable(state)] for name, state in ks.run_conformance(backend)]
    res["after"] = driver_table()
    return res


def check_scenarios(out: str) -> dict:
    """Every kernel_scenarios scenario against the real kernel: which hold here."""
    from gputopo.adapters.sysfs import RealSysfs

    ks = _kernel_scenarios()
    backend = ks.KernelBackend(port=RealSysfs("/"), root="/", **scenario_roles())
    res: dict = {}
    for sc in ks.SCENARIOS:
        try:
            sc(backend)
            res[sc.__name__] = None
        except Exception:
            res[sc.__name__] = traceback.format_exc(limit=3)
    return res


def replay_steps(roles: dict) -> list[tuple[str, str]]:
    """Raw writes (path below the root, value) that walk one stand-in card through the states
    the apply engine passes, including a half-moved group and a new_id grab."""
    gpu, audio, edu = roles["other_gpu"], roles["other_gpu"][:-1] + "1", roles["unbound_device"]
    d = "sys/bus/pci/devices"
    return [
        (f"{d}/{gpu}/driver_override", "vfio-pci"),
        (f"sys/bus/pci/drivers/{roles['gpu_driver']}/unbind", gpu),
        ("sys/bus/pci/drivers_probe", gpu),
        (f"sys/bus/pci/drivers/{roles['companion_driver']}/unbind", audio),
        (f"{d}/{audio}/driver_override", "vfio-pci"),
        ("sys/bus/pci/drivers_probe", audio),
        ("sys/bus/pci/drivers/vfio-pci/unbind", gpu),
        (f"{d}/{gpu}/driver_override", ""),
        (f"{d}/{gpu}/driver_override", "\n"),
        ("sys/bus/pci/drivers_probe", gpu),
        (f"{d}/{audio}/driver_override", "\n"),
        ("sys/bus/pci/drivers_probe", audio),
        ("sys/bus/pci/drivers/vfio-pci/unbind", audio),
        ("sys/bus/pci/drivers_probe", audio),
        ("sys/bus/pci/drivers/vfio-pci/new_id", "1234 11e8"),
        ("sys/bus/pci/drivers/vfio-pci/new_id", "1234 11e8"),
        ("sys/bus/pci/drivers/vfio-pci/remove_id", "1234 11e8"),
        ("sys/bus/pci/drivers/vfio-pci/remove_id", "1234 11e8"),
        ("sys/bus/pci/drivers/vfio-pci/unbind", edu),
        ("sys/bus/pci/drivers/vfio-pci/unbind", edu),
    ]


def replay_observe(root: str, roles: dict, viable) -> dict:
    """Drivers, overrides, the group's vfio node and its viability for the replayed devices."""
    gpu = roles["other_gpu"]
    addrs = [gpu, gpu[:-1] + "1", roles["unbound_device"]]
    group = link_name(f"{root}/{SYS_PCI}/{gpu}/iommu_group")
    node = os.path.exists(f"{root}/dev/vfio/{group}")
    return {
        "drivers": [link_name(f"{root}/{SYS_PCI}/{a}/driver") for a in addrs],
        "overrides": [rd(f"{root}/{SYS_PCI}/{a}/driver_override") for a in addrs],
        "vfio_node": node,
        "viable": viable(group) if node else None,
    }


def check_replay(out: str) -> dict:
    """replay_steps with plain writes on the real kernel: errno and state after each (the host
    replays them on the start snapshot; ``before`` shows the guest is still in that state)."""
    roles = scenario_roles()
    before = driver_table()
    steps = []
    for path, value in replay_steps(roles):
        rc = raw_write("/" + path, value)
        steps.append(
            {
                "path": path,
                "value": value,
                "result": errno.errorcode.get(rc, "ok"),
                **replay_observe("", roles, lambda g: vfio_status(g)["viable"]),
            }
        )
    return {"roles": roles, "before": before, "steps": steps, "after": driver_table()}


def check_persistence(out: str) -> dict:
    """Boot persistence with real kmod and udevd (guest/persistence.py); runs last, as it leaves
    udev's traces and the stand-in driver's state behind."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import persistence

    return persistence.check_persistence(out)


def check_udev(out: str) -> dict:
    """udev's side of a driver change with Debian's systemd-udevd (guest/udevwait.py): what
    pyudev.Monitor hears, gputopo's wait ending on udev's event, names from udev's database.
    Runs after ``persistence`` (which stops its udevd) and starts its own.

    ``follow`` (below) runs ``gputopo watch --follow`` under udevd the same way."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import persistence
    import udevwait

    log: list = []
    tools = persistence.Tools(log)
    why = tools.missing()
    if why:
        return {"unavailable": why}
    gpu, audio, group = stand_in_pair("0")
    res = udevwait.check_udev(tools, gpu, audio, group)
    res["log"] = log
    return res


def check_follow(out: str) -> dict:
    """``gputopo watch --follow`` hearing udev's events of a driver change (guest/udevwait.py's
    check_follow); runs after ``udev``, with udevd started again."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import persistence
    import udevwait

    log: list = []
    tools = persistence.Tools(log)
    why = tools.missing()
    if why:
        return {"unavailable": why}
    gpu, audio, _group = stand_in_pair("0")
    res = udevwait.check_follow(tools, gpu, audio, {a: udevwait._driver(a) for a in (gpu, audio)})
    res["log"] = log
    return res


CHECKS = {
    "discover": check_discover,
    "snapshot": check_snapshot,
    "bind_pair": check_bind_pair,
    "failures": check_failures,
    "rollback": check_rollback,
    "replay": check_replay,
    "conformance": check_conformance,
    "scenarios": check_scenarios,
    "persistence": check_persistence,
    "udev": check_udev,
    "follow": check_follow,
}


def main(argv: list[str]) -> int:
    out = argv[0]
    names = argv[1:] or list(CHECKS)
    results: dict = {"_meta": {"kernel": os.uname().release, "python": sys.version.split()[0]}}
    for name in names:
        t0 = time.monotonic()
        try:
            results[name] = {"data": CHECKS[name](out)}
        except BaseException:
            results[name] = {"error": traceback.format_exc()}
        results[name]["seconds"] = round(time.monotonic() - t0, 2)
        print(
            f"check {name}: {'error' if 'error' in results[name] else 'done'} "
            f"in {results[name]['seconds']} s",
            flush=True,
        )
        tmp = f"{out}/results.json.tmp"
        with open(tmp, "w") as f:
            json.dump(results, f, indent=1, default=repr)
        os.replace(tmp, f"{out}/results.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
