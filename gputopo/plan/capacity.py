"""The capacity check of a plan: does each container's served model fit the GPUs the plan gives
it, at the tensor-parallel size it will run with, before anything stops. Pure.

For each container of the spec with a ``service`` and GPUs: with the model's footprint read
(``ContainerState.footprint``) the plan carries its :class:`gputopo.capacity.estimate.Capacity`
(the line the text prints); a tensor-parallel size that does not divide the attention heads
(both engines assert it: sglang ``configs/model_config.py``, vllm ``config/model.py``
verify_with_parallel_config) or weights over the engine's budget is refused with code
``capacity``; a KV cache under ``verify.min_kv_tokens`` is a warning. A footprint that could
not be read is a line saying why, printed only where the service itself was read (a running
container, through the API and pct): from Proxmox's files, or for a stopped container, nothing
inside the container is read and nothing is said.
"""

from __future__ import annotations

from gputopo.capacity.estimate import Capacity, estimate, min_gpus
from gputopo.model.state import ContainerState
from gputopo.plan.findings import Findings
from gputopo.plan.spec import Container, Spec


def _divisors(heads: int, most: int) -> str:
    return ", ".join(str(d) for d in range(1, most + 1) if heads % d == 0)


def check_capacity(
    c: Container, state: ContainerState | None, tp: int, spec: Spec, gpus_on_host: int, found: Findings
) -> tuple[Capacity | None, str | None]:
    """(the capacity of container ``c``'s model at ``tp``, None) or (None, why it is unknown);
    (None, None) when there is nothing to say. Refusals and warnings go to ``found``."""
    if c.service is None or tp == 0 or state is None:
        return None, None
    fp = state.footprint
    if fp is None:
        if state.footprint_unread:
            why = state.footprint_unread
            return (
                None,
                f"container {c.vmid}: capacity not checked: the model's footprint could not be read ({why})",
            )
        return None, None
    cap = estimate(fp, c.vmid, tp)
    att = fp.attention
    if not cap.heads_divide:
        found.refuse(
            None,
            f"container {c.vmid}: tp {tp} does not divide {fp.name}'s {att.heads} attention heads "
            f"(SGLang and vLLM refuse to start); give it {_divisors(att.heads, gpus_on_host)} GPU(s)",
            "capacity",
        )
    elif cap.fits is False:
        need = min_gpus(fp, gpus_on_host)
        hint = (
            f"it needs at least {need} GPUs"
            if need
            else f"no split of this host's {gpus_on_host} GPUs fits it"
        )
        found.refuse(
            None,
            f"container {c.vmid}: {fp.name} does not fit {tp} GPU(s): weights {cap.weights_gib:.1f} GiB per GPU, "
            f"budget {cap.budget_gib:.1f} GiB ({cap.mem_fraction:g} of {cap.gpu_gib:.1f}); {hint}",
            "capacity",
        )
    floor = spec.verify.min_kv_tokens
    if cap.fits and floor is not None and cap.kv_tokens is not None and cap.kv_tokens < floor:
        found.warn(
            f"container {c.vmid}: KV cache about {cap.kv_tokens:,} tokens at tp {tp}, under "
            f"verify.min_kv_tokens {floor:,} ({cap.kv_gib or 0:.1f} GiB per GPU): give it more GPUs, or "
            "lower the floor"
        )
    return cap, None
