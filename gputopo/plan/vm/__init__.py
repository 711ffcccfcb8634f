"""The VM side of a plan: the VM entries of a spec (``spec``), the VMs consuming a mapping
(``consumers``), their NUMA placement and MMIO window (``place``), which VMs may start again
(``safety``)."""
