"""Simulated LXC containers and their inference service, behind :class:`gputopo.ports.ExecPort`.

A simulated host lives in one directory (docs/ARCHITECTURE.md, "Simulated host"); each
container's files are under ``ct/<vmid>/rootfs/`` and its runtime state is JSON in ``run/``.
The parts, each in its module:

* :mod:`.pct`: :class:`SimExec`, ``pct exec``/``pct push`` as a real node answers them;
* :mod:`.nvidia_smi`, :mod:`.systemctl`, :mod:`.coreutils`: the commands run inside
  (:mod:`.shell` holds what they share);
* :mod:`.lifecycle`: :class:`Container`, a container at run time (boot, shutdown, its ``/dev``
  view, its GPUs, its services' start and stop);
* :mod:`.devices`: the ``/dev`` nodes a config grants; :mod:`.gpus`: the host GPUs it can use
  and their memory; :mod:`.processes`: a service's processes as the host sees them;
* :mod:`.units`: systemd units and drop-ins; :mod:`.server_args`: what an inference server's
  command line says; :mod:`.journal`: what its starts and stops logged (``journalctl``);
* :mod:`.modelfiles`: the served model's directory (real ``config.json``, sparse safetensors
  shards); :mod:`.footprint`: what the model weighs and what the engine's start leaves for the KV
  cache, or how it fails;
* :mod:`.endpoint`: :class:`EndpointServer`, the service's OpenAI-compatible HTTP API;
* :mod:`.faults`: faults set on purpose (:func:`break_container`, :func:`heal_container`);
* :mod:`.paths`: :class:`SimPaths`, the directories of a simulated host.
"""

from gputopo.sim.container.endpoint import EndpointServer
from gputopo.sim.container.faults import break_container, heal_container
from gputopo.sim.container.lifecycle import Container
from gputopo.sim.container.paths import SimPaths
from gputopo.sim.container.pct import SimExec
from gputopo.sim.container.units import write_unit

__all__ = [
    "Container",
    "EndpointServer",
    "SimExec",
    "SimPaths",
    "break_container",
    "heal_container",
    "write_unit",
]
