"""A simulated Proxmox VE cluster: simulated hosts sharing one ``/etc/pve``, an API on every
node that answers for all of them, and each node's shell as SSH reaches it.

* :mod:`.build`: :func:`create_cluster` (``gputopo sim create --nodes N DIR``);
* :mod:`.cluster`: :class:`SimCluster` (members, the API of any node, a local node shell);
* :mod:`.peers`: the members one node's API server forwards node paths to;
* :mod:`.nodeshell`: what ``ssh root@<node> -- COMMAND`` runs on a simulated node.
"""

from gputopo.sim.cluster.build import create_cluster, node_names
from gputopo.sim.cluster.cluster import LocalNodeShell, SimCluster

__all__ = ["LocalNodeShell", "SimCluster", "create_cluster", "node_names"]
