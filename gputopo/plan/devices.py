"""What a container's device entries should be: ``devN`` lines (PVE >= 8.1) or legacy raw
``lxc.*`` lines, keeping entries that are already right at their index. Pure."""

from __future__ import annotations

from typing import Any

from gputopo.actions import UpdateContainer
from gputopo.formats.devn import (
    MAX_DEV_INDEX,
    dev_entries,
    dev_sort,
    devn_key,
    format_dev,
    is_nvidia_dev,
    is_nvidia_lxc,
)
from gputopo.model.facts import Gpu
from gputopo.plan.spec import Container

CONTROL_NODES = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
    "/dev/nvidia-caps/nvidia-cap1",
    "/dev/nvidia-caps/nvidia-cap2",
)
# Character majors of the dynamic nvidia nodes when neither the spec nor the facts give them
# (legacy mode only; devN makes Proxmox stat the node itself). Check /proc/devices on the host.
DEFAULT_LEGACY_MAJORS = {"nvidia-uvm": 511, "nvidia-caps": 510}


def _dev_paths(gpus: list[Gpu]) -> list[str]:
    return [f"/dev/nvidia{g.minor}" for g in gpus if g.minor is not None] + (
        list(CONTROL_NODES) if gpus else []
    )


def _legacy_lines(paths: list[str], majors: dict[str, int]) -> list[list[str]]:
    lines = [["lxc.cgroup2.devices.allow", "c 195:* rwm"]]
    lines.append(["lxc.cgroup2.devices.allow", f"c {majors['nvidia-uvm']}:* rwm"])
    lines.append(["lxc.cgroup2.devices.allow", f"c {majors['nvidia-caps']}:* rwm"])
    for p in paths:
        lines.append(["lxc.mount.entry", f"{p} {p[1:]} none bind,optional,create=file"])
    return lines


def _device_changes(
    config: dict[str, Any], wanted: list[str]
) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """(full desired devN dict, set, delete): keep entries already right, reuse free indices."""
    existing = dev_entries(config)
    keep: dict[str, str] = {}
    unwanted: list[str] = []
    missing = list(wanted)
    for k, v in sorted(existing.items(), key=lambda kv: dev_sort(kv[0])):
        if not is_nvidia_dev(v):
            keep[k] = v
        elif v in missing:
            keep[k] = v
            missing.remove(v)
        else:
            unwanted.append(k)
    used = set(keep)
    free = [devn_key(i) for i in range(MAX_DEV_INDEX + 1) if devn_key(i) not in used]
    to_set = dict(zip(free, missing))
    final = {**keep, **to_set}
    delete = [k for k in unwanted if k not in to_set]
    return final, to_set, delete


def _legacy_majors(c: Container, found: dict[str, int] | None = None) -> dict[str, int]:
    """The char majors of nvidia-uvm and nvidia-caps for legacy lines: the spec's, else those
    ``/proc/devices`` lists (``found``, the facts'), else the defaults."""
    majors = dict(DEFAULT_LEGACY_MAJORS)
    majors.update({k: v for k, v in (found or {}).items() if k in majors})
    majors.update({k: v for k, v in (c.legacy_majors or {}).items() if k in majors})
    return majors


def current_nvidia_lxc(
    config: dict[str, Any], c: Container, found: dict[str, int] | None = None
) -> list[list[str]]:
    """The raw ``lxc.*`` lines of ``config`` that gputopo manages for container ``c``: nvidia
    mount entries and device rules for nvidia's majors (195 and the spec's or default legacy
    ones). Other lxc lines are the operator's and are never touched."""
    majors = {195, *DEFAULT_LEGACY_MAJORS.values(), *_legacy_majors(c, found).values()}
    return [list(x) for x in config.get("lxc", []) or [] if is_nvidia_lxc(x[0], x[1], majors)]


def device_update(
    c: Container, gpus: list[Gpu], config: dict[str, Any], found: dict[str, int] | None = None
) -> tuple[dict[str, str], list[list[str]], UpdateContainer | None]:
    """(every devN entry the config will have, gputopo's lxc lines, the update or None);
    ``found``: the dynamic majors ``/proc/devices`` lists (the facts')."""
    paths = _dev_paths(gpus)
    majors = _legacy_majors(c, found)
    ours_lxc = current_nvidia_lxc(config, c, found)
    if c.device_mode == "devN":
        wanted = [format_dev(p, c.gid, c.mode) for p in paths]
        want_lxc: list[list[str]] = []
        # GPUs coming back from vfio-pci: apply resolves their entries after the switch
        resolve = [g.address for g in gpus if g.minor is None]
    else:
        wanted = []
        want_lxc = _legacy_lines(paths, majors) if gpus else []
        resolve = []
    devices, to_set, delete = _device_changes(config, wanted)
    lxc_add = [x for x in want_lxc if x not in ours_lxc]
    lxc_remove = [x for x in ours_lxc if x not in want_lxc]
    if not (to_set or delete or lxc_add or lxc_remove or resolve):
        return devices, want_lxc, None
    return (
        devices,
        want_lxc,
        UpdateContainer(
            vmid=c.vmid,
            set=to_set,
            delete=delete,
            digest=config.get("digest"),
            lxc_add=lxc_add,
            lxc_remove=lxc_remove,
            resolve=resolve,
            dev_gid=c.gid if resolve else None,
            dev_mode=(c.mode or None) if resolve else None,
        ),
    )
