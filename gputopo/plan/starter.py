"""Starter specs from a discovered host: quick mode (``plan --split numa``) and ``gputopo init``'s
commented file. Both validate through :class:`gputopo.plan.spec.Spec`, so they agree. Pure."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from gputopo.capacity.estimate import estimate, min_gpus
from gputopo.errors import SpecError
from gputopo.model.facts import Facts, Gpu, nvidia_gpus
from gputopo.model.owner import Owner
from gputopo.model.state import CurrentState
from gputopo.plan import placement
from gputopo.plan.select import held_by, held_now
from gputopo.plan.spec import API_VERSION, KIND, GpuSelector, Spec
from gputopo.plan.yamlspec import format_validation_error


def split_selectors(
    facts: Facts, split: str, now: dict[Owner, set[str]] | None = None, sizes: list[int] | None = None
) -> tuple[GpuSelector, GpuSelector]:
    """(container selector, VM selector) for a ``--split`` mode.

    ``numa``: the lowest NUMA node that has GPUs goes to the container, the other nodes to the VM.
    ``half``: the lower half of the GPUs by address to the container, the rest to the VM.
    ``auto``: :func:`gputopo.plan.placement.split` (each side as close together as the host
    allows, then balanced across NUMA nodes, then the fewest moves from ``now``: owner -> the
    addresses it has now, with the container first and the mapping second; ``sizes``: the GPU
    counts the container's served model runs on, :func:`model_sizes`); written as NUMA
    nodes when each side is whole NUMA nodes, else as addresses.
    Raises SpecError when the host cannot be split that way.
    """
    gpus = nvidia_gpus(facts)
    if not gpus:
        raise SpecError("--split", "", "the host has no NVIDIA GPUs")
    if split == "auto":
        if len(gpus) < 2:
            raise SpecError("--split", "auto", "one GPU cannot be split")
        held = list((now or {}).values())
        ct, vm = placement.split(gpus, held[0] if held else (), held[1] if len(held) > 1 else (), sizes)
        return _as_selector(gpus, ct), _as_selector(gpus, vm)
    if split == "numa":
        nodes = sorted({g.numa_node for g in gpus if g.numa_node is not None})
        if not nodes:
            raise SpecError("--split", "numa", "no GPU has a known NUMA node; use --split half or addresses")
        if len(nodes) < 2:
            raise SpecError("--split", "numa", f"all GPUs are on NUMA node {nodes[0]}; use --split half")
        return GpuSelector(numa=[nodes[0]]), GpuSelector(numa=nodes[1:])
    if split == "half":
        if len(gpus) < 2:
            raise SpecError("--split", "half", "one GPU cannot be split")
        half = len(gpus) // 2
        return (
            GpuSelector(addresses=[g.address for g in gpus[:half]]),
            GpuSelector(addresses=[g.address for g in gpus[half:]]),
        )
    raise SpecError("--split", "", f"unknown split {split!r} (expected numa, half or auto)")


def _as_selector(gpus: list, side: list) -> GpuSelector:
    """``side`` as NUMA nodes when it is every GPU of those nodes, else as addresses."""
    nodes = {g.numa_node for g in side}
    if None not in nodes and {g.address for g in gpus if g.numa_node in nodes} == {g.address for g in side}:
        return GpuSelector(numa=sorted(nodes))
    return GpuSelector(addresses=[g.address for g in side])


def spec_from_split(
    facts: Facts,
    split: str = "numa",
    container: int = 101,
    vm_mapping: str = "pro6000-vm",
    container_mapping: str | None = None,
    node: str | None = None,
    service_unit: str | None = None,
    tp_flag: str = "--tp",
    vm: int | None = None,
    current: CurrentState | None = None,
) -> Spec:
    """A Spec for the quick mode (``gputopo plan --split numa --container N --vm-mapping NAME``).

    ``vm`` adds that VM as the consumer of every GPU of the VM mapping (started, checked from
    its guest, its lines removed when the GPUs go back). ``current``: the state now, which
    ``auto`` keeps GPUs in (the fewest moves among equally good splits). Raises SpecError when the host cannot
    be split that way or a name is invalid.
    """
    now = _now(facts, current, container, vm_mapping, node) if split == "auto" else None
    sizes = model_sizes(facts, current, container) if split == "auto" else None
    ct_sel, vm_sel = split_selectors(facts, split, now, sizes)
    container_data: dict[str, Any] = {
        "vmid": container,
        "gpus": ct_sel.model_dump(exclude_none=True),
        **({"mapping": container_mapping} if container_mapping else {}),
        **({"service": {"unit": service_unit, "tp_flag": tp_flag}} if service_unit else {}),
    }
    vms_data: dict[str, Any] = {
        "mappings": [{"name": vm_mapping, "gpus": vm_sel.model_dump(exclude_none=True)}],
        **({"consumers": [_consumer_data(vm, vm_mapping)]} if vm else {}),
    }
    data: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "nodes": [
            {"name": node or facts.host.hostname or "pve1", "containers": [container_data], "vms": vms_data}
        ],
    }
    try:
        return Spec.model_validate(data)
    except ValidationError as e:
        raise format_validation_error("--split", e) from None


def model_sizes(facts: Facts, current: CurrentState | None, container: int) -> list[int] | None:
    """The GPU counts the container's served model can run on (its footprint read: a
    tensor-parallel size, a power of two, that divides its attention heads and whose weights fit,
    :mod:`gputopo.capacity.estimate`), None when its footprint is not known (any count)."""
    state = current.containers.get(container) if current is not None else None
    fp = state.footprint if state is not None else None
    if fp is None:
        return None
    n = len(nvidia_gpus(facts))
    need = min_gpus(fp, n)
    if need is None:
        return []
    return [
        tp
        for tp in range(need, n + 1)
        # a power of two: quick mode's spec has the default policy, whose tp_check refuses others
        if fp.attention.heads % tp == 0
        and not tp & (tp - 1)
        and estimate(fp, container, tp).fits is not False
    ]


def _now(
    facts: Facts, current: CurrentState | None, container: int, vm_mapping: str, node: str | None
) -> dict[Owner, set[str]] | None:
    """The container's and the VM mapping's GPUs now, in that order, for ``auto`` to keep them
    where they are; None without a current state."""
    if current is None:
        return None
    sides = [Owner.container(container), Owner.vm(vm_mapping)]
    held = held_by(held_now(facts, current, node or (facts.host.hostname or "").split(".")[0]), sides)
    return {o: held.get(o, set()) for o in sides}


def _consumer_data(vm: int, mapping: str) -> dict[str, Any]:
    """VM ``vm`` as the consumer of every GPU of ``mapping``: started, checked from its guest, its
    lines removed when the GPUs go back."""
    return {"vmid": vm, "mapping": mapping, "when_gpus_leave": "remove", "start": True, "verify_guest": True}


def _consumer_lines(vm: int | None, mapping: str, gpus: int) -> list[str]:
    """The ``consumers`` part of the starter spec: VM ``vm`` taking every GPU of ``mapping``, or a
    commented example."""
    head = [
        "      # consumers: VMs gputopo configures: one hostpciN line per GPU, CPUs pinned to the GPUs'",
        "      # NUMA node, OVMF's 64-bit MMIO window sized for their BARs",
    ]
    if vm is None:
        return head + [
            "      # consumers:",
            f"      #   - {{vmid: 201, mapping: {mapping}, gpus: {gpus}, when_gpus_leave: remove}}",
        ]
    return head + [
        "      consumers:",
        f"        - vmid: {vm}",
        f"          mapping: {mapping}",
        "          # when_gpus_leave: refuse, remove (its lines for GPUs going to a container) or repoint",
        "          when_gpus_leave: remove",
        "          # start: the VM should run; verify_guest: verify runs nvidia-smi in it (guest agent)",
        "          start: true",
        "          verify_guest: true",
    ]


def _yaml_list(values: list[Any]) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]"


def init_spec(
    facts: Facts, split: str = "numa", service_unit: str | None = "sglang.service", **options: Any
) -> str:
    """A commented starter spec (YAML text) for the discovered host; it parses with parse_spec
    into what :func:`spec_from_split` returns for the same options (``options`` are its other
    keyword arguments). Without ``service_unit`` the service block is written commented out
    (nothing inside the container is managed).

    Raises SpecError when the host cannot be split that way or an option's value is one the
    spec refuses (the field names the option's place in the spec).
    """
    # the same spec quick mode plans: validates every option before any text is written
    spec = spec_from_split(facts, split, service_unit=service_unit, **options)
    node_spec = spec.nodes[0]
    ct = node_spec.containers[0]
    tp_flag = ct.service.tp_flag if ct.service else options.get("tp_flag", "--tp")
    vm_mapping = node_spec.vms.mappings[0]
    vm = node_spec.vms.consumers[0].vmid if node_spec.vms.consumers else None
    assert isinstance(vm_mapping.gpus, GpuSelector)
    gpus = nvidia_gpus(facts)
    ct_sel = ct.gpus
    n_ct = len(
        [g for g in gpus if g.numa_node in (ct_sel.numa or []) or g.address in (ct_sel.addresses or [])]
    )
    lines = [
        *_header_lines(gpus),
        f"apiVersion: {API_VERSION}   # the spec format version",
        f"kind: {KIND}",
        "nodes:",
        "  # one entry per Proxmox node; name is the node name Proxmox uses",
        f"  - name: {node_spec.name}",
        *_container_lines(ct.vmid, ct_sel, ct.mapping),
        *_service_lines(service_unit, tp_flag, n_ct),
        "    vms:",
        "      mappings:",
        "        # a PCI mapping for VM passthrough; its GPUs are bound to vfio-pci per address",
        f"        - name: {vm_mapping.name}",
        "          # gpus: a selector like the container's, or 'rest' (every GPU no container claims)",
        "          gpus:",
        *_selector_lines(vm_mapping.gpus, "            "),
        "          # description: shown in Proxmox's mapping list (default: N GPU(s) for VM passthrough)",
        "      # guests: VM vmids using these mappings (stopped/started when their GPUs change)",
        "      guests: []",
        *_consumer_lines(vm, vm_mapping.name, len(gpus) - n_ct),
        *_POLICY_AND_VERIFY,
    ]
    return "\n".join(lines) + "\n"


def _selector_lines(sel: GpuSelector, indent: str) -> list[str]:
    """A NUMA or address selector as the lines under ``gpus:``."""
    if sel.numa is not None:
        return [f"{indent}numa: {_yaml_list(sel.numa)}"]
    return [f"{indent}addresses:"] + [f'{indent}  - "{a}"' for a in sel.addresses or []]


def _header_lines(gpus: list[Gpu]) -> list[str]:
    """The comment the file opens with: what it is, and the GPUs discovered by NUMA node."""
    by_numa: dict[Any, list[str]] = {}
    for g in gpus:
        by_numa.setdefault(g.numa_node, []).append(g.address)
    lines = [
        "# gputopo spec: which GPUs of this Proxmox host go to an LXC container (host nvidia",
        "# driver) and which to VM passthrough (vfio-pci). Check it with `gputopo plan --spec FILE`.",
        f"# Discovered: {len(gpus)} NVIDIA GPU(s); by NUMA node:",
    ]
    for numa, addrs in sorted(by_numa.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        label = "unknown" if numa is None else str(numa)
        lines.append(f"#   NUMA {label}: {', '.join(addrs)}")
    return lines


def _container_lines(vmid: int, sel: GpuSelector, mapping: str | None) -> list[str]:
    """The container's entry up to its service block."""
    lines = [
        "    containers:",
        "      # vmid: the LXC container that keeps GPUs on the host nvidia driver",
        f"      - vmid: {vmid}",
        "        # gpus: exactly one of numa: [ids], addresses: [PCI addresses], count: N",
        "        gpus:",
        *_selector_lines(sel, "          "),
    ]
    if mapping:
        lines += [
            "        # mapping: a PCI mapping listing the container's GPUs (informational for Proxmox)",
            f"        mapping: {mapping}",
        ]
    else:
        lines += ["        # mapping: optional PCI mapping listing the container's GPUs (informational)"]
    return lines + [
        "        # device_mode: devN (Proxmox >= 8.1) or legacy (lxc.cgroup2 + lxc.mount.entry lines)",
        "        device_mode: devN",
        "        # mode: the device nodes' mode in the container; gid: their group (unset: root)",
        '        mode: "0666"',
    ]


def _service_lines(service_unit: str | None, tp_flag: str, n_ct: int) -> list[str]:
    """The container's service block; commented out, with how to manage it, without a unit."""
    service = [
        "        service:",
        f"          unit: {service_unit or 'sglang.service'}",
        "          # tp_flag: --tp (SGLang) or --tensor-parallel-size (vLLM)",
        f'          tp_flag: "{tp_flag}"',
        f"          # TP will be {n_ct}. command: the full base ExecStart; unset = the unit's current one",
        "          # command: python3 -m sglang.launch_server --model-path /models/m --tp 4",
        "          # health_url: http://127.0.0.1:30000/health",
        "          # attention_heads: 64   # the TP size must divide it",
        "          dropin: gputopo.conf",
    ]
    head = ["        # service: the inference server whose tensor-parallel size follows the GPU count"]
    if service_unit:
        return head + service
    return (
        head
        + [
            "        # not managed: no unit was named or found inside the container (init with --sim,",
            "        # --api-url or --local looks for the unit that runs sglang or vllm). To manage it:",
        ]
        + ["        # " + ln[8:] for ln in service]
    )


_POLICY_AND_VERIFY = [
    "policy:",
    "  # keep driver_override=vfio-pci after binding, so a reprobe cannot take a VM GPU back",
    "  keep_driver_override: true",
    "  # tp_check: error or warn when the TP size is not a power of two / does not divide the heads",
    "  tp_check: error",
    "  # allow_cross_numa: silence the warning for a container spanning NUMA nodes",
    "  allow_cross_numa: false",
    "  # locality: GPUs of a container or VM mapping whose farthest pair is SYS (across",
    "  # sockets): prefer warns, strict refuses the plan",
    "  locality: prefer",
    "  # shutdown_timeout: seconds Proxmox waits for a guest to shut down cleanly",
    "  shutdown_timeout: 60",
    "  # force_stop: let Proxmox stop a guest by force after that (the step then warns);",
    "  # false: the step fails and apply rolls back",
    "  force_stop: false",
    "verify:",
    "  # max spread of memory use across the container's GPUs, in percent",
    "  memory_spread_pct: 5",
    "  # min_headroom_mib: free memory each GPU must keep (unset: not checked)",
    "  # min_kv_tokens: the fewest KV-cache tokens the plan's capacity estimate may leave (unset: not checked)",
    "  # a smoke-test prompt, the text the answer must contain, and its timeout in seconds",
    '  prompt: "What is 7 x 13? Answer with the number only."',
    '  expect: "91"',
    "  timeout: 120",
]
