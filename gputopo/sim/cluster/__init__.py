"""A simulated Proxmox VE cluster: simulated hosts sharing one ``/etc/pve``, an API on every
node that answers for all of them, and each node's shell as SSH reaches it.

* :mod:`.build`: :func:`create_cluster` (``gputopo sim create --nodes N DIR``);
* :mod:`.cluster`: :class:`SimCluster` (members, the API of any node, a local node shell);
* :mod:`.peers`: the members one node's API server forwards node paths to;
* :mod:`.nodeshell`: what ``ssh root@<node> -- COMMAND`` runs on a simulated node;
* :mod:`.sshd`: a real sshd per node on loopback and the ssh_config that reaches them
  (``gputopo sim cluster-ssh DIR``);
* :mod:`.reach`: a node broken to refuse SSH (``gputopo sim break node-unreachable``).

The names are imported when first used: the node shell starts for every SSH command and needs
none of them.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "create_cluster": "build",
    "node_names": "build",
    "SimCluster": "cluster",
    "LocalNodeShell": "cluster",
}
__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return getattr(importlib.import_module(f"gputopo.sim.cluster.{_NAMES[name]}"), name)
    raise AttributeError(name)
