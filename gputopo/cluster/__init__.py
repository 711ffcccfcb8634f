"""A Proxmox cluster driven from one spec: read every node, plan them, apply node by node over
SSH (each node its own apply), place VMs with HA, verify the whole.

* :mod:`.gather`: each node's facts and node-local state over SSH (version checked first), the
  shared state from the API of any node;
* :mod:`.plan`: :class:`ClusterPlan`, one plan per node, the mappings once, HA changes;
* :mod:`.ha`: where a VM with mapped GPUs can run, as HA rules (PVE 9) or groups (PVE 8);
* :mod:`.rolling`: the rolling apply (``--serial``, ``--canary``, stop at the first failure);
  :mod:`.noderun`: one node's own apply over SSH and its outcome; :mod:`.account`: the
  rollout's account (each node's :class:`~.account.Outcome`, the exit code, text and document);
* :mod:`.verify`: every node's verify and the cluster's checks (converged, migration);
* :mod:`.diff`: every node's diff and the HA files.
"""
