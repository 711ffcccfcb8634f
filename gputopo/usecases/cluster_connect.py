"""Reaching a cluster: the spec, the nodes, SSH and the API, as every cluster command needs them.

:class:`ClusterReach` is the spec, the node selection and how nodes are reached over SSH;
:class:`ClusterSource` is where the shared state comes from (a simulated cluster, an API, or
Proxmox's files offline). :func:`open_cluster` loads the spec, begins every node's own read
(one round trip each) while the API is reached, and selects the nodes; :func:`read_inputs`
takes the nodes' answers (or the offline facts) and :func:`plan_of` plans them.

The heavy modules (the planner, the simulator) are imported where they are used: the nodes'
reads are under way while they load.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ConfigDict

from gputopo.errors import ConfigError
from gputopo.model.strict import Strict

if TYPE_CHECKING:
    from gputopo.cluster.plan import ClusterPlan
    from gputopo.ports import Ports

DEFAULT_TIMEOUT = 120.0  # seconds one command on a node may take (reading it, its verify)


class ClusterReach(Strict):
    """The spec, the node selection and how nodes are reached: what every cluster command takes.
    ``nodes``: ``A,B`` (None: the spec's); ``timeout``: seconds one command on a node may take."""

    model_config = ConfigDict(frozen=True)

    spec_file: str
    nodes: str | None = None
    ssh_config: str | None = None
    ssh_user: str = "root"
    ssh_options: tuple[str, ...] = ()
    ssh_timeout: float = 10.0
    timeout: float = DEFAULT_TIMEOUT

    def wanted(self) -> list[str] | None:
        """The nodes asked for (``--nodes``), None for the spec's."""
        return [n.strip() for n in self.nodes.split(",") if n.strip()] if self.nodes else None


@dataclass(frozen=True)
class ClusterSource:
    """Where the shared state (guests, PCI mappings, HA) comes from.

    ``sim``: a simulated cluster's directory (``sim_ready`` raises when it cannot run here);
    ``api``: the API's ports given the node to name by default (``--api-url`` or ``--local``);
    neither: offline, Proxmox's files under ``pve_root`` (default ``/etc/pve``)."""

    sim: str | None = None
    api: Callable[[str], Ports] | None = None
    pve_root: str | None = None
    sim_ready: Callable[[], None] = lambda: None

    @property
    def live(self) -> bool:
        """Whether an API is read (``--sim``, ``--api-url`` or ``--local``)."""
        return self.sim is not None or self.api is not None


@dataclass
class OpenCluster:
    """What one cluster command works with; ``close()`` stops what was started (also as a
    context manager)."""

    spec: Any
    spec_text: str
    nodes: list[str]
    shell: Any = None
    ports: Any = None
    api: Any = None
    members: list[str] | None = None
    inputs: dict = field(default_factory=dict)
    ha: Any = None
    begun: Any = None  # the nodes' own reads, begun while the API is reached (until read_inputs takes them)

    def close(self) -> None:
        if self.begun is not None:
            self.begun.close(abort=True)  # only reads run while they are here: their answers are not wanted
            self.begun = None
        if self.ports is not None:
            self.ports.close()

    def __enter__(self) -> OpenCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ssh(reach: ClusterReach):
    from gputopo.adapters.ssh import SshRunner

    return SshRunner(
        user=reach.ssh_user,
        config_file=reach.ssh_config,
        options=reach.ssh_options,
        connect_timeout=reach.ssh_timeout,
    )


def _refuse_contradictions(source: ClusterSource, facts_dir: str | None) -> None:
    """Raises ConfigError for a source the options contradict, or none at all."""
    if source.sim is not None and source.api is not None:
        raise ConfigError("--sim excludes --api-url and --local (the simulated cluster serves its own API)")
    if not source.live and facts_dir is None:
        raise ConfigError(
            "reach the cluster with --api-url URL (or --local on a node, --sim DIR), "
            "or plan offline with --facts DIR"
        )


def _begin(c: OpenCluster, reach: ClusterReach, facts_dir: str | None) -> None:
    """Each node reads itself (one round trip) while the rest loads and the API is reached;
    they only read (a node --nodes or the cluster does not know is refused afterwards)."""
    if facts_dir is None and c.shell is not None and c.begun is None:
        from gputopo.cluster.noderead import NodeReads

        wanted = reach.wanted()
        names = [n.name for n in c.spec.nodes if wanted is None or n.name in wanted]
        c.begun = NodeReads(c.spec, names, c.shell, reach.timeout)


def _reach_api(c: OpenCluster, reach: ClusterReach, source: ClusterSource, facts_dir: str | None) -> None:
    """The API's ports and the cluster's members, where a source serves them."""
    if source.sim is not None:
        from gputopo.sim.cluster import SimCluster

        source.sim_ready()
        sim = SimCluster(source.sim)
        c.shell = c.shell or sim.shell()
        _begin(c, reach, facts_dir)
        c.ports = sim.ports()
    elif source.api is not None:
        c.ports = source.api(c.spec.nodes[0].name)
    if c.ports is not None:
        from gputopo.adapters.clusterapi import ClusterApi

        c.api = ClusterApi(c.ports.proxmox)
        c.members = c.api.members()


def open_cluster(reach: ClusterReach, source: ClusterSource, facts_dir: str | None = None) -> OpenCluster:
    """Load the spec and reach the cluster as the options say; the caller closes it. Raises
    ConfigError, SpecError, UnknownNode, ProxmoxError, SimHostError."""
    from gputopo.plan.spec import parse_spec, read_spec_text

    text = read_spec_text(reach.spec_file)  # once: the nodes are sent this text, and it may be a pipe
    spec = parse_spec(text, reach.spec_file)
    if source.live and source.pve_root is not None:
        raise ConfigError(
            "--pve-root reads Proxmox's files; --sim, --api-url and --local read the API instead"
        )
    c = OpenCluster(spec=spec, spec_text=text, nodes=[])
    ssh = _ssh(reach)
    _refuse_contradictions(source, facts_dir)
    if source.live and (source.sim is None or reach.ssh_config):
        c.shell = ssh  # (a simulated cluster without --ssh-config runs each node's shell here)
    try:
        _begin(c, reach, facts_dir)
        _reach_api(c, reach, source, facts_dir)
        from gputopo.cluster.gather import select_nodes

        c.nodes = select_nodes(spec, reach.wanted(), c.members)
    except BaseException:
        c.close()
        raise
    return c


def read_inputs(
    c: OpenCluster, source: ClusterSource, timeout: float, facts_dir: str | None, with_ha: bool = True
) -> None:
    """Every selected node's facts and current state into ``c.inputs`` (the nodes' own reads,
    or ``facts_dir`` offline), and the cluster's HA configuration into ``c.ha`` (``with_ha``,
    where an API answers). Raises NodeUnreachable, VersionMismatch, RemoteCommandFailed,
    SpecError, ProxmoxError."""
    from gputopo.cluster.gather import read_cluster, read_offline
    from gputopo.cluster.ha import read_ha

    if facts_dir is not None:
        proxmox = c.ports.proxmox if c.ports is not None else None
        c.inputs = read_offline(c.spec, c.nodes, Path(facts_dir), source.pve_root, proxmox)
    else:
        begun, c.begun = c.begun, None
        c.inputs = read_cluster(c.spec, c.nodes, c.shell, c.ports.proxmox, timeout, begun=begun, ha=with_ha)
    if with_ha and c.api is not None:
        c.ha = read_ha(c.api)


def plan_of(c: OpenCluster, spec_file: str) -> ClusterPlan:
    """The cluster plan of what ``c`` read, each node planned by the one read-and-plan's pure half
    (:func:`gputopo.usecases.readplan.spec_and_plan`, ``spec_file`` its source). Raises
    PlanRefused with every node's refusals."""
    from gputopo.cluster.plan import plan_cluster
    from gputopo.usecases.readplan import spec_and_plan
    from gputopo.usecases.specsource import SpecSource

    source = SpecSource(spec_file=spec_file)

    def plan_one(facts, spec, current, node, templates):
        return spec_and_plan(facts, current, source, spec, node, templates)[1]

    return plan_cluster(c.spec, c.inputs, c.nodes, ha=c.ha, members=c.members, plan_one=plan_one)


def open_and_plan(
    reach: ClusterReach, source: ClusterSource, facts_dir: str | None = None, with_ha: bool = True
) -> tuple[OpenCluster, ClusterPlan]:
    """Open, read and plan the cluster; the caller closes what it returns (closed here when
    this raises). Raises what :func:`open_cluster`, :func:`read_inputs` and :func:`plan_of` raise."""
    c = open_cluster(reach, source, facts_dir)
    try:
        read_inputs(c, source, reach.timeout, facts_dir, with_ha)
        return c, plan_of(c, reach.spec_file)
    except BaseException:
        c.close()
        raise
