"""The desired-state spec: ``apiVersion: gputopo/v1``, ``kind: GpuTopology``.

The spec is strict: unknown keys are errors, and every error becomes ONE
:class:`gputopo.errors.SpecError` line naming the file, the field path
(``nodes[0].containers[0].gpus.numa``) and what was expected. ``Spec.model_json_schema()`` is
what ``gputopo schema spec`` prints.

Pure: :func:`load_spec` reads the one file it is given; nothing else touches the host.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from gputopo.errors import AddressError, SpecError
from gputopo.model.facts import normalize_address
from gputopo.model.strict import Strict
from gputopo.plan.vm.spec import MAPPING_ID_PATTERN, VmConsumer, check_consumers
from gputopo.plan.yamlspec import MAX_DEPTH, format_validation_error, load_yaml

API_VERSION = "gputopo/v1"
KIND = "GpuTopology"
DEFAULT_DROPIN = "gputopo.conf"


class GpuSelector(Strict):
    """Which GPUs: exactly one of ``numa``, ``addresses`` or ``count``."""

    numa: list[int] | None = Field(None, description="NUMA node ids; GPUs of unknown NUMA never match")
    addresses: list[str] | None = Field(None, description="PCI addresses (dddd:bb:dd.f or bb:dd.f)")
    count: int | None = Field(
        None,
        ge=1,
        description=(
            "N GPUs not claimed elsewhere, closest together first (one switch, then one host bridge, "
            "then one NUMA node), lowest address on ties"
        ),
    )

    @field_validator("addresses")
    @classmethod
    def _normalise(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        out = []
        for text in value:
            try:
                out.append(normalize_address(str(text)))
            except AddressError as e:
                raise ValueError(str(e)) from None
        return out

    @model_validator(mode="after")
    def _exactly_one(self) -> GpuSelector:
        given = [k for k in ("numa", "addresses", "count") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"exactly one of numa, addresses, count expected (got {', '.join(given) or 'none'})"
            )
        return self

    def describe(self) -> str:
        if self.numa is not None:
            return "numa " + ",".join(str(n) for n in self.numa)
        if self.addresses is not None:
            return "addresses " + ",".join(self.addresses)
        return f"count {self.count}"


class Service(Strict):
    """The inference service inside the container whose tensor-parallel size follows the GPUs."""

    unit: str = Field(description="systemd unit inside the container, e.g. sglang.service")
    tp_flag: str = Field(
        "--tp",
        pattern=r"^--?[A-Za-z][A-Za-z0-9-]*$",
        description="'--tp' (SGLang) or '--tensor-parallel-size' (vLLM)",
    )
    command: str | None = Field(
        None, description="Full base ExecStart command; when absent, the unit's current one"
    )
    health_url: str | None = None
    dropin: str = Field(DEFAULT_DROPIN, description="Drop-in file name under <unit>.d/")
    attention_heads: int | None = Field(
        None, ge=1, description="The model's attention heads; the TP size must divide it"
    )

    @field_validator("unit")
    @classmethod
    def _unit(cls, value: str) -> str:
        if "/" in value or not value.strip():
            raise ValueError("a systemd unit name such as sglang.service expected")
        return value if "." in value else value + ".service"

    @field_validator("dropin")
    @classmethod
    def _dropin(cls, value: str) -> str:
        if "/" in value or not value.endswith(".conf"):
            raise ValueError("a file name ending in .conf expected")
        return value


class Container(Strict):
    """An LXC container that gets GPUs on the host nvidia driver."""

    vmid: int = Field(ge=100, le=999999999)
    gpus: GpuSelector
    mapping: str | None = Field(
        None,
        pattern=MAPPING_ID_PATTERN,
        description="PCI mapping listing the container's GPUs (informational)",
    )
    device_mode: Literal["devN", "legacy"] = Field(
        "devN", description="devN (PVE >= 8.1) or legacy lxc.cgroup2/lxc.mount.entry lines"
    )
    gid: int | None = Field(None, ge=0, description="gid of the device nodes inside the container")
    mode: str = Field("0666", pattern=r"^0[0-7]{3}$", description="device node mode, e.g. 0666")
    legacy_majors: dict[str, int] | None = Field(
        None,
        description="legacy mode only: char majors of nvidia-uvm and nvidia-caps (see /proc/devices)",
    )
    service: Service | None = None

    @field_validator("mode", mode="before")
    @classmethod
    def _quoted_mode(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            # YAML reads an unquoted 0666 as the octal number 438
            raise ValueError(
                f'a quoted mode such as "0666" expected (unquoted, YAML reads it as the number {value})'
            )
        return value

    @field_validator("legacy_majors")
    @classmethod
    def _majors(cls, value: dict[str, int] | None) -> dict[str, int] | None:
        if value is None:
            return None
        unknown = sorted(set(value) - {"nvidia-uvm", "nvidia-caps"})
        if unknown:
            raise ValueError(f"keys nvidia-uvm and nvidia-caps expected (got {', '.join(unknown)})")
        bad = sorted(k for k, v in value.items() if not 1 <= v <= 4095)
        if bad:
            raise ValueError(f"a char major 1..4095 expected for {', '.join(bad)}")
        return value


class VmMapping(Strict):
    """A Proxmox PCI resource mapping that holds VM GPUs (bound to vfio-pci)."""

    name: str = Field(pattern=MAPPING_ID_PATTERN)
    gpus: GpuSelector | Literal["rest"] = Field(
        description="a selector, or 'rest': every NVIDIA GPU no container claims"
    )
    description: str | None = None

    @field_validator("gpus", mode="before")
    @classmethod
    def _rest_or_selector(cls, value: Any) -> Any:
        if isinstance(value, dict) or value == "rest":
            return value
        raise ValueError(f"'rest' or a selector with numa, addresses or count expected (got {value!r})")


class Vms(Strict):
    mappings: list[VmMapping] = Field(default_factory=list)
    guests: list[int] = Field(default_factory=list, description="VM vmids that use the mappings")
    consumers: list[VmConsumer] = Field(
        default_factory=list, description="VMs whose hostpciN lines, placement and firmware gputopo writes"
    )
    other_mappings: Literal["keep", "shrink"] = Field(
        "keep",
        description=(
            "Mappings the spec does not manage that list GPUs a container gets: keep them as they are "
            "(verify warns, and fails when a VM uses one), or shrink them to their other GPUs (deleted "
            "when none is left)"
        ),
    )


class Node(Strict):
    name: str = Field(min_length=1, description="Proxmox node name, e.g. pve1")
    containers: list[Container] = Field(default_factory=list)
    vms: Vms = Field(default_factory=Vms)

    @model_validator(mode="after")
    def _unique(self) -> Node:
        seen: set[int] = set()
        for i, ct in enumerate(self.containers):
            if ct.vmid in seen:
                raise ValueError(f"containers[{i}].vmid: container {ct.vmid} is listed twice")
            seen.add(ct.vmid)
        names: set[str] = set()
        for i, m in enumerate(self.vms.mappings):
            if m.name.lower() in names:
                raise ValueError(f"vms.mappings[{i}].name: mapping {m.name} is listed twice")
            names.add(m.name.lower())
        for i, ct in enumerate(self.containers):
            if ct.mapping and ct.mapping.lower() in names:
                raise ValueError(
                    f"containers[{i}].mapping: {ct.mapping} is also a VM mapping; a VM mapping "
                    "must hold only VM GPUs"
                )
        if sum(1 for m in self.vms.mappings if m.gpus == "rest") > 1:
            raise ValueError("vms.mappings: only one mapping may take 'rest'")
        check_consumers(self.vms.consumers, seen)
        return self


class StepTimeouts(Strict):
    """Seconds a step of each kind may wait; unset: gputopo's default. ``--timeout KIND=SECONDS``
    on the command line wins over these."""

    sysfs: float | None = Field(None, gt=0, allow_inf_nan=False, description="One sysfs write (default 30)")
    guest: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="A container or VM start or shutdown task (default 300)"
    )
    exec: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="One command in a container, e.g. systemctl stop (default 60)",
    )
    service: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="Until a started service reports active (default 900)"
    )

    def given(self) -> dict[str, float]:
        """The kinds that are set: kind -> seconds."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


class Policy(Strict):
    keep_driver_override: bool = Field(
        True,
        description=(
            "Leave driver_override=vfio-pci set after binding, so a reprobe or an nvidia module "
            "reload cannot take a VM GPU back"
        ),
    )
    pin_native_driver: bool = Field(
        False,
        description=(
            "Leave driver_override=nvidia set on container GPUs after binding them back (they are "
            "always bound by name, so a vfio-pci dynamic id cannot take them; this also pins them "
            "against a later reprobe)"
        ),
    )
    tp_check: Literal["error", "warn"] = Field(
        "error", description="What a TP size the service cannot use is: a refusal or a warning"
    )
    allow_cross_numa: bool = Field(
        False, description="Silence the warning for a container spanning NUMA nodes"
    )
    locality: Literal["prefer", "strict"] = Field(
        "prefer",
        description=(
            "A container's or VM mapping's GPUs whose farthest pair is SYS (across NUMA nodes or host "
            "bridges without a known common node): prefer warns, strict refuses the plan"
        ),
    )
    container_restart: Literal["auto", "always"] = Field(
        "auto",
        description=(
            "auto: a running container whose GPUs change keeps running where Proxmox allows it, only "
            "its service restarts: one that gives GPUs to VMs (their devN removal stays pending until "
            "its next restart), one that gains GPUs on PVE 9 (devN hot-plug); always: stop and start it"
        ),
    )
    hotplug_failure: Literal["restart", "rollback"] = Field(
        "restart",
        description=(
            "A devN hot-plug Proxmox refuses while a container keeps running (container_restart: "
            "auto, PVE 9): restart stops the container, makes the change and starts it again (as "
            "a PVE 8 node needs anyway); rollback undoes the apply"
        ),
    )
    shutdown_timeout: int = Field(
        60,
        ge=1,
        le=3600,
        description="Seconds Proxmox waits for a guest to shut down cleanly (the shutdown's timeout; its default is 60)",
    )
    force_stop: bool = Field(
        False,
        description=(
            "Let Proxmox stop a guest by force (forceStop) when it does not shut down within "
            "shutdown_timeout: the step then warns. Off: the step fails and apply rolls back"
        ),
    )
    timeouts: StepTimeouts = Field(default_factory=StepTimeouts)


class Verify(Strict):
    memory_spread_pct: float = Field(
        5,
        ge=0,
        le=100,
        description="Most the memory use of the container's GPUs may spread ((max-min)/max), in percent",
    )
    min_headroom_mib: int | None = Field(None, ge=0)
    min_kv_tokens: int | None = Field(
        None,
        ge=0,
        description="Fewest tokens the served model's KV cache should hold per the plan's capacity "
        "estimate; below it the plan warns (unset: not checked)",
    )
    prompt: str = "What is 7 x 13? Answer with the number only."
    expect: str = "91"
    timeout: float = Field(120, gt=0)
    guest_timeout: float = Field(
        300, gt=0, description="Seconds a guest check waits for the VM's guest agent"
    )


class Spec(Strict):
    """The whole spec. ``nodes`` holds one entry per Proxmox node."""

    apiVersion: Literal["gputopo/v1"]
    kind: Literal["GpuTopology"]
    nodes: list[Node] = Field(min_length=1)
    policy: Policy = Field(default_factory=Policy)
    verify: Verify = Field(default_factory=Verify)

    @model_validator(mode="after")
    def _unique_nodes(self) -> Spec:
        names = [n.name for n in self.nodes]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise ValueError(f"nodes[{i}].name: node {name} is listed twice")
        return self

    def node(self, name: str | None) -> Node:
        """The node called ``name``; with ``None`` the only node.

        Raises SpecError when there is no such node or the choice is ambiguous.
        """
        if name is None:
            if len(self.nodes) == 1:
                return self.nodes[0]
            raise SpecError(
                "spec", "nodes", f"several nodes ({', '.join(n.name for n in self.nodes)}); name one"
            )
        for n in self.nodes:
            if n.name == name:
                return n
        raise SpecError(
            "spec", "nodes", f"no node named {name!r} (have {', '.join(n.name for n in self.nodes)})"
        )


# --- loading -------------------------------------------------------------------------------


def parse_spec(text: str, file: str = "<spec>") -> Spec:
    """Parse spec YAML text. Returns the Spec; raises SpecError (one line) for any problem,
    a document nested deeper than :data:`MAX_DEPTH` included."""
    try:
        return _parse_spec(text, file)
    except RecursionError:  # a last resort: load_yaml refuses deep documents before this
        raise SpecError(file, "", f"nested too deeply to be a spec (more than {MAX_DEPTH} levels)") from None


def _parse_spec(text: str, file: str) -> Spec:
    data = load_yaml(text, file)
    if not isinstance(data, dict):
        raise SpecError(file, "", f"a mapping with apiVersion: {API_VERSION} and kind: {KIND} expected")
    if data.get("apiVersion") != API_VERSION:
        raise SpecError(file, "apiVersion", f"{API_VERSION!r} expected (got {data.get('apiVersion')!r})")
    try:
        return Spec.model_validate(data)
    except ValidationError as e:
        raise format_validation_error(file, e) from None


def read_spec_text(path: str | Path) -> str:
    """The text of the spec file at ``path`` (read once: it may be a pipe). Raises SpecError."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError(str(path), "", f"cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise SpecError(str(path), "", f"not UTF-8 text (byte {e.start})") from None


def load_spec(path: str | Path) -> Spec:
    """Read and parse the spec file at ``path``. Raises SpecError naming the file."""
    return parse_spec(read_spec_text(path), str(path))
