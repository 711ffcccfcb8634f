"""What a consumer's config gets for its GPUs besides the ``hostpciN`` lines, each with its
note for the plan, its warnings and refusals: the placement keys (``affinity``, ``numa``,
``numa0``, ``hugepages``), the 64-bit MMIO window in ``args``, and the machine and BIOS its GPU
lines need (:mod:`gputopo.plan.vm.place` computes them). Pure."""

from __future__ import annotations

from typing import Any

from gputopo.formats.hostpci import NUMA_KEY, with_mmio64_mb
from gputopo.formats.qemuconf import is_q35, memory_mib
from gputopo.model.facts import Facts, Gpu
from gputopo.plan.findings import Findings
from gputopo.plan.vm.place import gib, mmio, mmio_note, phys_bits_note, placement
from gputopo.plan.vm.spec import VmConsumer


def check_firmware(c: VmConsumer, cfg: dict[str, str], n: int, found: Findings) -> None:
    """Refuse a machine type or BIOS its ``n`` GPU lines cannot work with."""
    if c.pcie and n and not is_q35(cfg):
        found.refuse(
            None,
            f"VM {c.vmid} is i440fx (machine: {cfg.get('machine', 'default')}) but pcie=1 needs "
            "machine q35: set machine: q35 or pcie: false",
            "vm-machine",
        )
    if c.x_vga and n and cfg.get("bios", "seabios") == "ovmf":
        found.refuse(
            None,
            f"VM {c.vmid}: x-vga=1 is dropped with bios ovmf (qemu-server passes it to SeaBIOS "
            "only): set x-vga: false",
            "vm-x-vga",
        )


def mmio_keys(
    c: VmConsumer,
    cfg: dict[str, str],
    gpus: list[Gpu],
    n: int,
    want: dict[str, str],
    notes: list[str],
    found: Findings,
) -> None:
    """Add the 64-bit MMIO window its ``n`` GPUs need to ``want``'s ``args`` (OVMF); refuse
    SeaBIOS when they do not fit its default window, and an ``mmio64_mb`` too small for them."""
    vm = f"VM {c.vmid}"
    bios = cfg.get("bios", "seabios")
    m = mmio(gpus, n, cfg.get("args"), c.mmio64_mb)
    if not m.fits_default() and bios != "ovmf":
        found.refuse(
            None,
            (
                f"{vm} boots SeaBIOS, which cannot map {gib(m.need)} of 64-bit BARs ({n} GPU(s), largest BAR "
                f"{gib(m.largest)}): set bios: ovmf (with an efidisk0)"
            ),
            "vm-seabios",
        )
    elif c.mmio64_mb is not None and m.need > c.mmio64_mb << 20:
        found.refuse(
            None,
            f"{vm}: mmio64_mb {c.mmio64_mb} is smaller than its GPUs' {gib(m.need)} of 64-bit BARs",
            "vm-mmio",
        )
    elif bios == "ovmf":
        if m.set_mb is not None:
            want["args"] = with_mmio64_mb(cfg.get("args"), m.set_mb)
            pb = phys_bits_note(m.set_mb, memory_mib(cfg), cfg.get("cpu"))
            if pb:
                found.warn(f"{vm}: {pb}")
        notes.append(mmio_note(m))


def placement_keys(
    c: VmConsumer,
    facts: Facts,
    cfg: dict[str, str],
    gpus: list[Any],
    want: dict[str, str],
    notes: list[str],
    found: Findings,
) -> None:
    """Add the affinity, numa, numa0 and hugepages keys (with their reasons) to ``want``."""
    vm = f"VM {c.vmid}"
    pl = placement(facts, gpus)
    if len(pl.nodes) > 1:
        where = ", ".join(f"{g.address} on {g.numa_node}" for g in gpus if g.numa_node is not None)
        found.warn(
            f"{vm}: its GPUs span NUMA nodes {', '.join(map(str, pl.nodes))} ({where}): "
            "its memory and half its GPU traffic cross sockets"
        )
    if pl.unknown:
        found.warn(f"{vm}: NUMA node unknown for {', '.join(pl.unknown)}; its CPUs are not pinned")
    nodes = ",".join(map(str, pl.nodes))
    if c.affinity and pl.affinity is not None:
        if not pl.affinity:
            found.refuse(
                None,
                f"{vm}: NUMA node {nodes} has no CPUs, and an empty affinity fails at VM "
                "start: set affinity: false",
                "vm-affinity",
            )
            return
        want["affinity"] = pl.affinity
        notes.append(
            f"affinity {pl.affinity}: the CPUs of NUMA node {nodes}, where its GPUs are; its vCPUs and "
            "QEMU's threads stay on that socket"
        )
    if c.numa:
        want["numa"] = "1"
        custom = sorted(k for k in cfg if NUMA_KEY.match(k) and k != "numa0")
        hotplug = "memory" in cfg.get("hotplug", "").split(",")
        if len(pl.nodes) == 1 and not custom and not hotplug:
            sockets, cores = int(cfg.get("sockets", "1")), int(cfg.get("cores", "1"))
            vcpus = sockets * cores
            cpus = "0" if vcpus == 1 else f"0-{vcpus - 1}"
            want["numa0"] = f"cpus={cpus},hostnodes={nodes},memory={memory_mib(cfg)},policy=bind"
            notes.append(
                f"numa: 1, numa0 hostnodes={nodes},policy=bind: its memory comes from node {nodes} "
                "(qemu-server otherwise takes guest memory and hugepages from host node 0 upwards)"
            )
        elif custom or hotplug:
            why = f"its own NUMA topology ({', '.join(custom)})" if custom else "memory hotplug"
            found.warn(f"{vm} has {why}; numa0 is left alone, its memory is not bound to node {nodes or '?'}")
    if c.hugepages:
        want["hugepages"] = c.hugepages
        size = {"2": "2 MiB", "1024": "1 GiB", "any": "1 GiB where possible, else 2 MiB"}[c.hugepages]
        notes.append(
            f"hugepages {c.hugepages}: guest memory in {size} pages, taken on node {nodes or '?'} at "
            "start (they must be free there)"
        )
