"""Render the files a plan stands for, from jinja2 templates (StrictUndefined).

Built-in templates live in :func:`gputopo.resources.templates_dir`; a ``templates`` directory
given by the user overrides any single template by file name. The planner renders its
WriteHostFile / WriteServiceDropin / SetMapping contents with these same functions, so what
``gputopo render`` writes and what apply writes are one thing.

Rendered paths (relative to the output directory):

* ``pve/lxc/<vmid>.devices.conf``  -- only the container's GPU lines (devN or legacy lxc.*)
* ``pve/qemu-server/<vmid>.gpus.conf`` -- only the VM config keys gputopo owns (``hostpciN``,
  ``affinity``, ``numa``, ``numa0``, ``hugepages``, ``args``), in Proxmox's key order
* ``pve/mapping/pci.cfg``          -- the mapping sections, exactly as Proxmox writes them
* ``etc/udev/rules.d/90-gputopo-vfio.rules``, ``etc/modules-load.d/gputopo-vfio.conf``
* ``ct/<vmid>/etc/systemd/system/<unit>.d/<dropin>`` -- the service drop-in

Pure: reads only template files.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from gputopo.errors import ConfigError
from gputopo.formats.devn import by_dev_index
from gputopo.formats.lxcrules import validate_lxc_conf
from gputopo.formats.pcicfg import validate_pci_cfg
from gputopo.formats.qemuconf import validate_qemu_conf
from gputopo.formats.systemctl import set_tp
from gputopo.resources import templates_dir

UDEV_RULES_PATH = "etc/udev/rules.d/90-gputopo-vfio.rules"
MODULES_PATH = "etc/modules-load.d/gputopo-vfio.conf"
MODPROBE_PATH = "etc/modprobe.d/gputopo-vfio.conf"
# Every host file the persistence of per-address binding consists of.
PERSISTENCE_PATHS = (UDEV_RULES_PATH, MODULES_PATH, MODPROBE_PATH)
VFIO_MODULES = ("vfio", "vfio_iommu_type1", "vfio_pci")
# The module the GPUs the container keeps are bound to; the modprobe.d hook sits on it.
NATIVE_DRIVER = "nvidia"
TEMPLATE_NAMES = (
    "lxc-devices.conf.j2",
    "qemu-gpus.conf.j2",
    "pci.cfg.j2",
    "udev-vfio.rules.j2",
    "modules-vfio.conf.j2",
    "service-dropin.conf.j2",
)


@lru_cache(maxsize=8)
def environment(templates: str | None = None) -> jinja2.Environment:
    """The jinja2 environment: user ``templates`` first, then the built-ins.

    Raises ConfigError when ``templates`` is not a directory.
    """
    loaders: list[jinja2.BaseLoader] = []
    if templates:
        if not Path(templates).is_dir():
            raise ConfigError(f"--templates {templates}: not a directory")
        loaders.append(jinja2.FileSystemLoader(str(templates)))
    loaders.append(jinja2.FileSystemLoader(str(templates_dir())))
    return jinja2.Environment(
        loader=jinja2.ChoiceLoader(loaders),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        auto_reload=False,  # templates do not change under a run: no stat per file rendered
    )


def _render(name: str, templates: str | None, **context: Any) -> str:
    try:
        text = environment(templates).get_template(name).render(**context)
    except jinja2.TemplateError as e:
        raise ConfigError(f"template {name}: {type(e).__name__}: {e}".splitlines()[0]) from None
    text = text.rstrip("\n")
    return text + "\n" if text else ""


# --- the single files ------------------------------------------------------------------------


def render_devices_conf(
    devices: list[tuple[str, str]], lxc: list[tuple[str, str]], templates: str | None = None
) -> str:
    """The container's GPU lines: ``devN: value`` and/or raw ``lxc.*: value`` (never ``#`` lines)."""
    return _render("lxc-devices.conf.j2", templates, devices=devices, lxc=lxc)


def render_vm_keys(keys: dict[str, str], templates: str | None = None) -> str:
    """A VM's keys as config lines, sorted as qemu-server's writer sorts them (by name)."""
    return _render("qemu-gpus.conf.j2", templates, keys=sorted(keys.items()))


def render_pci_cfg(sections: list[dict[str, Any]], templates: str | None = None) -> str:
    """``pci.cfg`` text for sections ``{id, map: [entries], description}``, sorted by id.

    Proxmox's writer puts ``map`` lines first and the other keys sorted, a tab before each,
    and a blank line after every section.
    """
    ordered = []
    for s in sorted(sections, key=lambda s: s["id"]):
        other = []
        if s.get("description"):
            other.append(("description", str(s["description"]).replace("\n", " ")))
        for k, v in sorted((s.get("other") or {}).items()):
            other.append((k, v))
        ordered.append({"id": s["id"], "map": list(s["map"]), "other": sorted(other)})
    text = _render("pci.cfg.j2", templates, sections=ordered)
    # SectionConfig::write_config ends every section, the last one too, with a blank line
    return text + "\n" if text else ""


def render_udev_rules(addresses: list[str], templates: str | None = None) -> str:
    """udev rules setting ``driver_override=vfio-pci`` per address (never ``vfio-pci ids=``)."""
    return _render("udev-vfio.rules.j2", templates, addresses=sorted(addresses))


def render_modules(templates: str | None = None) -> str:
    """modules-load.d list of the vfio modules VM passthrough needs."""
    return _render("modules-vfio.conf.j2", templates, modules=list(VFIO_MODULES))


def render_modprobe(addresses: list[str], templates: str | None = None, driver: str = NATIVE_DRIVER) -> str:
    """modprobe.d hook: whenever ``driver`` (nvidia) loads, the VM GPUs' overrides are set first.

    The udev rule alone races: the first GPU's add event can load nvidia, which then probes every
    unbound GPU, including VM GPUs whose own add event has not run yet. ``driver`` is the
    template's ``driver`` variable: the module the hook sits on.
    """
    return _render("modprobe-vfio.conf.j2", templates, addresses=sorted(addresses), driver=driver)


def persistence_files(
    addresses: list[str], templates: str | None = None, driver: str = NATIVE_DRIVER
) -> dict[str, str]:
    """Every boot-time persistence file for binding ``addresses`` to vfio-pci (empty: none);
    the modprobe.d hook sits on the module ``driver``."""
    if not addresses:
        return {}
    return {
        UDEV_RULES_PATH: render_udev_rules(addresses, templates),
        MODULES_PATH: render_modules(templates),
        MODPROBE_PATH: render_modprobe(addresses, templates, driver),
    }


def render_dropin(
    command: str, tp_flag: str, tp: int, p2p_disable: bool, templates: str | None = None
) -> str:
    """The service drop-in: ``ExecStart=`` reset, the command with TP set, the environment.

    ``command`` is a plain command line (as ``systemctl show`` prints it): its ``%`` signs are
    doubled so that systemd does not read them as unit specifiers. Raises ConfigError for a
    broken user template.
    """
    return _render(
        "service-dropin.conf.j2",
        templates,
        command=set_tp(command, tp_flag, tp).replace("%", "%%"),
        tp=tp,
        p2p_disable=p2p_disable,
    )


def dropin_path(unit: str, dropin: str) -> str:
    """The drop-in's absolute path inside the container."""
    return f"/etc/systemd/system/{unit}.d/{dropin}"


def p2p_must_be_disabled(facts: Any) -> bool:
    """True when SEV-SNP is on and the IOMMU translates DMA (peer-to-peer DMA can corrupt data).

    The IOMMU translates when it is on and the command line does not ask for ``iommu=pt``
    (translated is the kernel's default); False when SEV-SNP is off or unknown.
    """
    host = facts.host
    return bool(host.sev_snp) and host.iommu_enabled and host.iommu_mode not in ("pt", "off")


# --- everything a plan stands for ------------------------------------------------------------


def _check_proxmox(path: str, template: str, problems: list[str]) -> None:
    if problems:
        # a user template (or an odd value kept from the current file) can break Proxmox's
        # parser rules; Proxmox would drop such a line silently, so nothing is written
        raise ConfigError(f"{path} (from template {template}) breaks Proxmox's rules: {problems[0]}")


def render(plan: Any, spec: Any = None, facts: Any = None, templates: str | None = None) -> dict[str, str]:
    """Every file of ``plan`` (a :class:`gputopo.plan.planner.Plan`): relative path -> text.

    ``spec`` and ``facts`` are accepted for symmetry with the planner; the plan already carries
    what was derived from them. The Proxmox files are checked with Proxmox's parser rules
    (:mod:`gputopo.formats`). Raises ConfigError for a broken or missing user template, or one
    whose output Proxmox would not accept as written.
    """
    out: dict[str, str] = {}
    for ct in plan.containers:
        devices = by_dev_index(ct.devices)
        path = f"pve/lxc/{ct.vmid}.devices.conf"
        out[path] = render_devices_conf(
            [(k, v) for k, v in devices if v.startswith("/dev/nvidia")] if ct.device_mode == "devN" else [],
            [tuple(x) for x in ct.lxc],
            templates,
        )
        _check_proxmox(path, "lxc-devices.conf.j2", validate_lxc_conf(out[path], allow_description=False))
        if ct.service is not None and ct.service.command is not None:
            path = dropin_path(ct.service.unit, ct.service.dropin)
            out[f"ct/{ct.vmid}{path}"] = render_dropin(
                ct.service.command, ct.service.tp_flag, ct.service.tp, plan.p2p_disable, templates
            )
    for vm in getattr(plan, "vms", []):
        path = f"pve/qemu-server/{vm.vmid}.gpus.conf"
        out[path] = render_vm_keys(vm.config, templates)
        # the keys alone: what only the whole config can break is checked by the planner
        _check_proxmox(
            path, "qemu-gpus.conf.j2", validate_qemu_conf(out[path], allow_description=False, at_start=False)
        )
    sections = [
        {"id": mid, "map": m.map, "description": m.description}
        for mid, m in {**plan.kept_mappings, **plan.mappings}.items()
        if m.map
    ]
    if sections:
        out["pve/mapping/pci.cfg"] = render_pci_cfg(sections, templates)
        _check_proxmox("pve/mapping/pci.cfg", "pci.cfg.j2", validate_pci_cfg(out["pve/mapping/pci.cfg"]))
    out.update(persistence_files(plan.vfio_addresses(), templates))
    return out
