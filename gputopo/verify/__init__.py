"""Verify: an independent health check of a host against its spec, the operator's "all clear".

Everything is read fresh (a new :func:`gputopo.facts.discover.discover` and
:func:`gputopo.facts.observe.observe`), never taken from what an apply remembers. Eight
checks, each PASS / WARN / FAIL with the numbers behind it, one module each:

1. :mod:`~gputopo.verify.converged` -- a fresh plan is empty;
2. :mod:`~gputopo.verify.vm`        -- VM GPUs and their group companions on vfio-pci,
   ``/dev/vfio`` present, Proxmox's own mapping check clean;
3. :mod:`~gputopo.verify.container` -- nvidia-smi inside each container lists exactly its GPUs;
4. :mod:`~gputopo.verify.memory`    -- memory used balanced across a service's GPUs, with headroom;
5. :mod:`~gputopo.verify.service`   -- the unit active with the planned tensor-parallel size;
6. :mod:`~gputopo.verify.inference` -- the endpoint answers the smoke-test prompt in time and
   reports its KV-cache size;
7. :mod:`~gputopo.verify.capacity`  -- the plan's capacity estimate beside what the service and
   nvidia-smi report: memory used per GPU and KV-cache tokens, the difference in percent;
8. :mod:`~gputopo.verify.platform`  -- peer-to-peer DMA disabled where SEV-SNP needs it;
9. :mod:`~gputopo.verify.guest`     -- only when asked (``start_vms``, or ``verify_guest`` on a VM):
   the VM's guest lists its GPUs (nvidia-smi through the QEMU guest agent); left out otherwise.

They share one :class:`~gputopo.verify.context.Context` (facts, current state, plan, and each
container's nvidia-smi and ``systemctl show`` read once); their evidence is parsed by the pure
functions of :mod:`~gputopo.verify.parse`; their verdicts make a
:class:`~gputopo.verify.report.VerifyReport`. ``report.ok`` is False for any FAIL (and for any
WARN when ``strict``), ``report.exit_code`` is 0 or 1.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gputopo.errors import GputopoError
from gputopo.plan.spec import Spec
from gputopo.ports import Ports
from gputopo.verify import (
    capacity,
    container,
    converged,
    guest,
    inference,
    memory,
    platform,
    service,
    vm,
)
from gputopo.verify.context import Context, ReadForChecks, checks_context
from gputopo.verify.report import FAIL, PASS, WARN, Check, Status, VerifyReport

__all__ = [
    "CHECKS",
    "REGISTRY",
    "FAIL",
    "PASS",
    "WARN",
    "Check",
    "Context",
    "ReadForChecks",
    "Status",
    "VerifyReport",
    "verify",
]

#: check name -> its function, in the order verify runs them; each takes the Context and returns its
#: Check (None: not asked for, left out of the report), and a GputopoError it raises becomes a FAIL
REGISTRY: dict[str, Callable[[Context], Check | None]] = {
    m.NAME: m.check for m in (converged, vm, container, memory, service, inference, capacity, platform, guest)
}
#: the checks every verification reports (the guest check runs only when asked; the capacity
#: check reports only where the plan has a served model's estimate to compare)
CHECKS = tuple(n for n in REGISTRY if n not in (guest.NAME, capacity.NAME))


def verify(
    spec: Spec,
    ports: Ports,
    *,
    root: str | Path,
    read: ReadForChecks,
    http_timeout: float | None = None,
    strict: bool = False,
    node: str | None = None,
    only: list[str] | None = None,
    start_vms: bool = False,
) -> VerifyReport:
    """Check the host under ``root`` (through ``ports``) against ``spec`` from fresh facts.

    ``read`` makes the one read of the host the checks share
    (:func:`gputopo.usecases.readplan.read_for_checks`; :func:`gputopo.usecases.verify.verify`
    passes it). ``http_timeout`` bounds the whole inference probe (default: ``spec.verify.timeout``);
    ``only`` limits the checks to those names (default all of :data:`REGISTRY`, in that order);
    ``start_vms`` runs the guest check on every VM of ``vms.consumers``, starting a stopped one
    (and stopping it again).
    Returns the :class:`VerifyReport`; a check that cannot be made is a FAIL in it, not an
    exception. Raises RootError when ``root`` holds no sysfs tree, SpecError when the spec names
    no node for this host, ValueError for an unknown name in ``only``.
    """
    names = list(only) if only else list(REGISTRY)
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        raise ValueError(f"unknown check(s) {', '.join(unknown)} (known: {', '.join(CHECKS)})")
    timeout = float(http_timeout if http_timeout is not None else spec.verify.timeout)
    ctx = checks_context(spec, ports, str(root), node, timeout, read)
    ctx.start_vms = start_vms
    report = VerifyReport(node=ctx.node, strict=strict)
    for name in names:
        try:
            got = REGISTRY[name](ctx)
            if got is not None:
                report.checks.append(got)
        except GputopoError as e:
            report.checks.append(Check(name=name, status=FAIL, summary=str(e), details={"error": str(e)}))
    return report
