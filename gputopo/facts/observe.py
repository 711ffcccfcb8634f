"""Reading a host: its facts and its current Proxmox state, assembled in this one place.

Every command that plans or checks a host (apply, plan, diff, render, verify, export, the
topology view, each node of a cluster) reads it through :func:`observe`; only where each part
comes from differs, and that is what the caller passes: a host root to discover (or facts read
elsewhere: a snapshot, ``gputopo discover --json`` of a cluster node), the read half of the
Proxmox port (the API, or Proxmox's files), and the container and host-file ports. What to read
comes from the caller as a function of the facts (the spec's node depends on the host's name;
:func:`gputopo.plan.reads.spec_reads` says it for a spec), so reading needs nothing from
planning. Whether a guest is HA-managed is read the same way: one more read in
:func:`gputopo.facts.current.read_current` through the same ports (``guest_ha``), the ``ha``
field of each guest's state in :class:`gputopo.model.state.CurrentState`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple

from gputopo.facts.current import read_current
from gputopo.facts.discover import discover
from gputopo.model.facts import Facts
from gputopo.model.reads import Reads
from gputopo.model.state import CurrentState
from gputopo.ports import ClusterApiPort, ExecPort, HostFilesPort, ProxmoxReadPort


class Observed(NamedTuple):
    """What a host is now: its facts and its current state (``facts, current = observe(...)``)."""

    facts: Facts
    current: CurrentState


def observe(
    host: str | os.PathLike | Facts,
    reads: Callable[[Facts], Reads],
    *,
    proxmox: ProxmoxReadPort,
    exec: ExecPort | None = None,
    files: HostFilesPort | None = None,
    cluster: ClusterApiPort | None = None,
) -> Observed:
    """The facts of ``host`` (a root to discover, or facts already read) and the current state
    ``reads(facts)`` asks for, read through ``proxmox``, ``exec`` (services) and ``files``;
    with ``cluster``, the cluster's HA configuration too (HA placement is planned from it).

    Raises what discover raises (RootError), what ``reads`` raises (SpecError: no node of the
    spec is this host) before anything is read, and ProxmoxError from the source.
    """
    facts = host if isinstance(host, Facts) else discover(str(host))
    return Observed(
        facts, read_current(reads(facts), proxmox=proxmox, exec=exec, files=files, cluster=cluster)
    )
