"""A simulated Linux kernel behind :class:`gputopo.ports.SysfsPort`: PCI bind semantics on a tree.

:class:`SimKernel` changes a materialised fixture or snapshot root the way the kernel changes
``/sys`` when userspace writes the PCI driver attributes. Its parts:

* :mod:`.bind`: :class:`SimKernel` and what each write does (bind, unbind, drivers_probe,
  new_id, remove_id, driver_override, remove, rescan), with the kernel sources each rule follows;
* :mod:`.match`: which driver matches a device (id tables, dynamic ids, driver_override);
* :mod:`.tree`: reading the PCI tree (addresses, drivers, ids, IOMMU groups, holders);
* :mod:`.attach`: what binding, unbinding and removal change in the tree (links, nvidia's
  ``proc``/``dev`` entries, ``dev/vfio/<group>``);
* :mod:`.faults`: injected faults, latencies and the time scale;
* :mod:`.events`: what this instance did and when (:class:`KernelEvent`), for tests;
* :mod:`.statefile`: the state file every process using the same root shares;
* :mod:`.parse` and :mod:`.nvidia`: the text formats written and read back.
"""

from gputopo.sim.kernel.bind import SimKernel
from gputopo.sim.kernel.events import KernelEvent

__all__ = ["KernelEvent", "SimKernel"]
