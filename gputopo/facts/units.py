"""The inference server a container runs, found by looking inside it (edge layer: this is I/O).

Three commands through the :class:`gputopo.ports.ExecPort` (``pct exec``): the service units
systemd has loaded, the unit files installed, and one ``systemctl show`` of all of them; the
pure functions of :mod:`gputopo.formats.systemctl` pick the units whose command runs SGLang or
vLLM and read their tensor-parallel flag and size.
"""

from __future__ import annotations

from gputopo.errors import ExecError
from gputopo.formats.systemctl import (
    LIST_UNIT_FILES,
    LIST_UNITS,
    SHOW_PROPS,
    InferenceUnit,
    candidate_units,
    inference_units,
    parse_show_blocks,
)
from gputopo.ports import ExecPort

TIMEOUT = 20.0


def read_inference_units(exec: ExecPort, vmid: int, timeout: float = TIMEOUT) -> list[InferenceUnit]:
    """The units of container ``vmid`` that run an inference server, the active ones first.

    Raises ExecError when systemctl cannot be run there (the container is stopped, or pct fails).
    """
    listed = exec.run(vmid, LIST_UNITS, timeout)
    if listed.rc != 0:
        raise ExecError(vmid, LIST_UNITS, listed.rc, listed.stderr)
    files = exec.run(vmid, LIST_UNIT_FILES, timeout)
    names = candidate_units(listed.stdout, files.stdout if files.rc == 0 else "")
    if not names:
        return []
    show = exec.run(vmid, ["systemctl", "show", *SHOW_PROPS, *names], timeout)
    if show.rc != 0:
        raise ExecError(vmid, ["systemctl", "show", *SHOW_PROPS, "..."], show.rc, show.stderr)
    return inference_units(parse_show_blocks(show.stdout))


# what a quick mode that cannot look inside the container leaves out (the plan then has no
# command to run, and no model to size: the capacity check needs the service's command)
UNSEEN = "the service is not managed and its model's fit is not checked"


def find_inference_unit(exec: ExecPort, vmid: int) -> tuple[InferenceUnit | None, str | None]:
    """(the unit of container ``vmid`` that runs SGLang or vLLM, None), or (None, why there is
    none, one line). A container that cannot be looked into is such a line, not an error: the
    service is then not managed."""
    try:
        units = read_inference_units(exec, vmid)
    except ExecError as e:
        # pct missing (exit 127): this machine cannot look inside, as the service read says it
        why = f"no {e.stderr.split(':', 1)[0] or 'pct'} on this machine" if e.rc == 127 else str(e)
        return (
            None,
            f"container {vmid}: cannot look for its inference unit ({why}); {UNSEEN}",
        )
    if not units:
        return None, f"container {vmid}: no unit runs sglang or vllm; the service is not managed"
    return units[0], None
