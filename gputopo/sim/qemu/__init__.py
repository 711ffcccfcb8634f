"""What happens inside and around a simulated VM: its start and stop as qemu-server does them
(:mod:`.runtime`), its firmware's BAR placement (:mod:`.firmware`) and its guest with the QEMU
guest agent (:mod:`.guest`)."""

from gputopo.sim.qemu.guest import hang_agent

__all__ = ["hang_agent"]
