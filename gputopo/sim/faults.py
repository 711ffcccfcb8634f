"""The faults ``gputopo sim break`` puts into a simulated host (or a cluster's node) and
``gputopo sim heal`` takes out again: one table, each fault with what it models and how
gputopo sees it.

Each one sets what the simulator already models, in the host's run state, so every process
working on the directory (a served API, an apply, the node shell behind sshd) obeys it at once:

* the inference service: ``service-fails`` (its next starts fail),
  ``wrong-answer`` and ``hung-endpoint`` (its HTTP endpoint) -- :mod:`gputopo.sim.container.faults`;
* ``gpu-missing``: a GPU falls off the bus (:meth:`gputopo.sim.kernel.SimKernel.fall_off`);
  healing it is what an operator does once the card answers again, a PCI rescan;
* ``hotplug-fails``: Proxmox VE 9's hot-plug of a new devN into the running container fails
  (:meth:`gputopo.sim.pveapi.PveApiServer.inject_hotplug_failure`);
* ``slow-shutdown``: the VM's guest OS takes long to shut down after Proxmox's ACPI powerdown
  (the ``qmshutdown`` latency: :mod:`gputopo.sim.pveapi.shutdown`);
* ``node-unreachable`` (a cluster's node only): the node does not answer SSH
  (:mod:`gputopo.sim.cluster.reach`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gputopo.errors import SimHostError
from gputopo.sim import state
from gputopo.sim.container.faults import break_container, faults_of, heal_container

# how long the slow VM takes to shut down: more than Proxmox's 60 s default timeout
# (qemu-server QemuServer.pm _do_vm_stop), so a shutdown without forceStop fails
SLOW_SHUTDOWN = 600.0


@dataclass(frozen=True)
class Fault:
    name: str
    what: str  # what breaks, one line
    seen: str  # how gputopo sees it, one line
    put: Callable[[Any, dict], str]  # (SimHost, options) -> what was done, one line
    take: Callable[[Any], None]
    active: Callable[[Any], bool]
    cluster_only: bool = False
    options: tuple[str, ...] = ()  # what put() takes: address, seconds


def _container(what: str, **defaults: Any):
    def put(host, opts: dict) -> str:
        params = {**defaults, **{k: v for k, v in opts.items() if v is not None}}
        break_container(host.dir, host.container, what, **params)
        return f"CT {host.container}: {what.replace('_', ' ')}"

    def take(host) -> None:
        heal_container(host.dir, host.container, what)

    def active(host) -> bool:
        return what in faults_of(host.dir, host.container)

    return put, take, active


def _kernel(host):
    from gputopo.sim.kernel import SimKernel

    return SimKernel(str(host.paths.root))


def _gpu_off(host, opts: dict) -> str:
    from gputopo.facts.discover import discover

    kernel = _kernel(host)
    gpus = [g.address for g in discover(str(host.paths.root)).gpus if g.driver == "nvidia"]
    address = opts.get("address")
    if address is None:
        if not gpus:
            raise SimHostError(str(host.dir), "no GPU on the nvidia driver to take off the bus")
        address = gpus[-1]
    try:
        kernel.fall_off(address)
    except KeyError:
        raise SimHostError(str(host.dir), f"no PCI device {address}") from None
    return f"{address} fell off the bus"


def _gpu_rescan(host) -> None:
    _kernel(host).write("/sys/bus/pci/rescan", "1")


def _gpu_gone(host) -> bool:
    return bool(_kernel(host).removed())


def _hotplug_put(host, opts: dict) -> str:
    from gputopo.sim.pveapi.guest_config import add_hotplug_fault

    if int(host.version.split(".")[0]) < 9:
        # before PVE 9 a new devN of a running container waits for its restart (pending): there
        # is no hot-plug to fail (gputopo.sim.pveapi.guest_config, update of a running container)
        raise SimHostError(
            str(host.dir),
            f"hotplug-fails: Proxmox VE {host.version} does not hot-plug devN into a running container "
            "(sim create --pve-version 9.1.2 makes a node that does)",
        )
    add_hotplug_fault(host.paths.run, host.container, count=None)
    return f"CT {host.container}: every hot-plug of a new devN fails"


def _hotplug_take(host) -> None:
    from gputopo.sim.pveapi.guest_config import clear_hotplug_faults

    clear_hotplug_faults(host.paths.run, host.container)


def _hotplug_active(host) -> bool:
    from gputopo.sim.pveapi.guest_config import HOTPLUG_FAULTS

    faults = state.read_state(host.paths.run, HOTPLUG_FAULTS, []) or []
    return any(f["vmid"] == host.container for f in faults)


def _vm(host) -> int:
    return int(host.info.get("vm", 201))


def _slow_put(host, opts: dict) -> str:
    seconds = float(opts.get("seconds") or SLOW_SHUTDOWN)
    with state.locked(host.paths.run, "latencies"):
        lat = state.read_state(host.paths.run, "latencies", {}) or {}
        lat[f"qmshutdown:{_vm(host)}"] = seconds
        state.write_state(host.paths.run, "latencies", lat)
    return f"VM {_vm(host)}: its guest takes {seconds:g} s to shut down"


def _slow_take(host) -> None:
    with state.locked(host.paths.run, "latencies"):
        lat = state.read_state(host.paths.run, "latencies", {}) or {}
        lat.pop(f"qmshutdown:{_vm(host)}", None)
        state.write_state(host.paths.run, "latencies", lat)


def _slow_active(host) -> bool:
    return f"qmshutdown:{_vm(host)}" in (state.read_state(host.paths.run, "latencies", {}) or {})


def _unreachable_put(host, opts: dict) -> str:
    from gputopo.sim.cluster.reach import set_unreachable

    set_unreachable(host.dir, True)
    return f"node {host.node}: refuses SSH connections"


def _unreachable_take(host) -> None:
    """Heal the node; while ``sim cluster-ssh`` serves the cluster, return once the node's sshd
    accepts a connection again (SimHostError when it does not within a bound)."""
    from gputopo.sim.cluster.peers import cluster_dir_of
    from gputopo.sim.cluster.reach import set_unreachable
    from gputopo.sim.cluster.served import revive, serving, wait_accepting

    set_unreachable(host.dir, False)
    cluster_dir = cluster_dir_of(host)
    if serving(cluster_dir):
        revive(cluster_dir, host.node)
        wait_accepting(cluster_dir, host.node)


def _unreachable_active(host) -> bool:
    from gputopo.sim.cluster.reach import unreachable

    return unreachable(host.dir)


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault(
            "service-fails",
            "the inference service fails to start (crashes during startup) until healed",
            "apply stops at the service's start: it does not start again (exit 3), recover once healed",
            *_container("service_fails", message="RuntimeError: server crashed during startup"),
        ),
        Fault(
            "wrong-answer",
            "the inference endpoint answers the smoke test's prompt wrong",
            "verify's smoke test FAILs",
            *_container("wrong_answer"),
        ),
        Fault(
            "hung-endpoint",
            "the inference endpoint accepts requests and never answers (--seconds, default an hour)",
            "verify's smoke test FAILs after its timeout",
            *_container("hung_endpoint", seconds=3600.0),
            options=("seconds",),
        ),
        Fault(
            "gpu-missing",
            "a GPU falls off the PCI bus (--address, default the last GPU on nvidia); heal rescans the bus",
            "plan, verify and watch refuse, naming the address, its owner and that it left the bus",
            _gpu_off,
            _gpu_rescan,
            _gpu_gone,
            options=("address",),
        ),
        Fault(
            "hotplug-fails",
            "Proxmox VE 9 cannot hot-plug a new devN into the running container",
            "apply warns 'could not hot-plug' and restarts the container with the change",
            _hotplug_put,
            _hotplug_take,
            _hotplug_active,
        ),
        Fault(
            "slow-shutdown",
            f"the VM's guest takes long to shut down (--seconds, default {SLOW_SHUTDOWN:g})",
            "apply's VM stop fails after the spec's shutdown_timeout and rolls back",
            _slow_put,
            _slow_take,
            _slow_active,
            options=("seconds",),
        ),
        Fault(
            "node-unreachable",
            "a cluster node refuses SSH connections (its sshd is down)",
            "cluster plan/apply stop: 'node NAME: unreachable over SSH'",
            _unreachable_put,
            _unreachable_take,
            _unreachable_active,
            cluster_only=True,
        ),
    )
}


def fault(name: str) -> Fault:
    """The fault called ``name``. Raises SimHostError naming the known ones."""
    try:
        return FAULTS[name]
    except KeyError:
        raise SimHostError(name, f"unknown fault (known: {', '.join(FAULTS)})") from None


def target(dir, node: str | None):
    """The simulated host ``break``/``heal`` act on: ``dir`` itself, or node ``node`` of the
    cluster in ``dir``. Returns (host, in_cluster). Raises SimHostError for a cluster without
    ``node``, ``node`` given for a host, or a directory that holds neither."""
    from gputopo.sim.cluster import SimCluster
    from gputopo.sim.host import SimHost

    if SimCluster.is_cluster(dir):
        cluster = SimCluster(dir)
        if node is None:
            raise SimHostError(str(dir), f"a cluster: name the node with --node ({', '.join(cluster.nodes)})")
        return cluster.member(node), True
    host = SimHost.open(dir)
    if node is not None and node != host.node:
        raise SimHostError(str(dir), f"--node {node}: the simulated host here is node {host.node}")
    return host, False


def put(dir, name: str, node: str | None = None, **opts: Any) -> str:
    """Break ``name`` in the host in ``dir`` (or its ``node``); returns what was done."""
    f = fault(name)
    for option in opts:
        if option not in f.options:
            takers = [n for n, g in FAULTS.items() if option in g.options]
            raise SimHostError(name, f"--{option} is for {' and '.join(takers)}, not {name}")
    host, in_cluster = target(dir, node)
    if f.cluster_only and not in_cluster:
        raise SimHostError(
            str(dir), f"{name}: only a cluster's node can be unreachable (sim create --nodes N)"
        )
    return f.put(host, opts)


def take(dir, name: str | None = None, node: str | None = None) -> list[str]:
    """Heal ``name`` (every active fault when None); returns the names healed. On a cluster
    without ``node``: on every node, each name healed then given as ``NODE: NAME``. On a
    cluster that ``sim cluster-ssh`` serves, healing every fault or ``node-unreachable`` also
    starts again an sshd that exited without ``sim break`` (said as ``sshd started again``)."""
    from gputopo.sim.cluster import SimCluster

    if node is None and SimCluster.is_cluster(dir):
        nodes = SimCluster(dir).nodes
        healed = [f"{n}: {f}" for n in nodes for f in _take(dir, name, n)]
        return healed + [f"{n}: {did}" for n, did in _sshd_again(dir, name, nodes).items()]
    healed = _take(dir, name, node)
    if node is not None and SimCluster.is_cluster(dir):
        healed += list(_sshd_again(dir, name, [node]).values())
    return healed


def _sshd_again(dir, name: str | None, nodes: list[str]) -> dict[str, str]:
    """The sshd of each of ``nodes`` that exited by itself, started again (see :func:`take`)."""
    from gputopo.sim.cluster import SimCluster
    from gputopo.sim.cluster.reach import unreachable
    from gputopo.sim.cluster.served import restart_exited

    if name not in (None, "node-unreachable"):
        return {}
    cluster = SimCluster(dir)
    return restart_exited(cluster.dir, nodes, lambda n: unreachable(cluster.node_dir(n)))


def _take(dir, name: str | None, node: str | None) -> list[str]:
    host, in_cluster = target(dir, node)
    names = [name] if name is not None else [n for n, f in FAULTS.items() if not f.cluster_only or in_cluster]
    healed = []
    for n in names:
        f = fault(n)
        if f.cluster_only and not in_cluster:
            continue
        if f.active(host):
            f.take(host)
            healed.append(n)
    return healed


def active(dir, node: str | None = None) -> list[str]:
    """The faults now in the host in ``dir`` (or its ``node``)."""
    host, in_cluster = target(dir, node)
    return [n for n, f in FAULTS.items() if (not f.cluster_only or in_cluster) and f.active(host)]
