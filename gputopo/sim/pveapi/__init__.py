"""A simulated Proxmox VE API server (:class:`PveApiServer`) and ``pvesh`` (:class:`PveshSim`).

See :mod:`gputopo.sim.pveapi.server` for what it answers and where its state lives.
"""

from gputopo.sim.pveapi.pvesh import PveshSim
from gputopo.sim.pveapi.server import PveApiServer

__all__ = ["PveApiServer", "PveshSim"]
