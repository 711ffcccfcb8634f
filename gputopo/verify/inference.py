"""Check ``inference``: each service answers ``verify.prompt`` with ``verify.expect`` through its
OpenAI-compatible chat completion within the timeout (a hung endpoint fails, never hangs the
tool), and reports its KV-cache capacity in tokens (a WARN when it does not).

The endpoint is the spec's ``service.health_url``, else the container's address (Proxmox's
``GET /nodes/{node}/lxc/{vmid}/interfaces``) and the port of the service's command. All HTTP
goes through ``ports.http``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from gputopo.errors import GputopoError, HttpError
from gputopo.plan.spec import Service
from gputopo.ports import HttpPort, HttpResponse
from gputopo.verify.context import Context, services_not_run
from gputopo.verify.parse import (
    answer_matches,
    base_url,
    container_address,
    parse_sglang_kv_tokens,
    parse_vllm_kv_tokens,
    server_flavor,
    service_port,
)
from gputopo.verify.report import FAIL, PASS, WARN, Check, Status, skipped, verdict

NAME = "inference"

# (server, path, what details say, how to read the reply): where each server tells its KV-cache size
_KV_SOURCES: list[tuple[str, str, str, Callable[[HttpResponse], int | None]]] = [
    (
        "sglang",
        "/get_server_info",
        "sglang /get_server_info max_total_num_tokens",
        lambda r: parse_sglang_kv_tokens(r.json()),
    ),
    ("vllm", "/metrics", "vllm /metrics num_gpu_blocks x block_size", lambda r: parse_vllm_kv_tokens(r.text)),
]


def endpoint_url(ctx: Context, vmid: int, svc: Service) -> tuple[str | None, str]:
    """(the base URL of container ``vmid``'s service ``svc``, where it came from): the spec's
    ``health_url``; else the container's address (Proxmox's interfaces of the running container)
    and the server's port. (None, why) when neither is known."""
    if svc.health_url:
        return base_url(svc.health_url), "service.health_url"
    port = service_port(ctx.service_command(vmid, svc.unit))
    if port is None:
        return None, "no --port in the service's command (set service.health_url in the spec)"
    try:
        address = container_address(ctx.ports.proxmox.lxc_interfaces(vmid))
    except GputopoError as e:
        return None, f"cannot read the container's address ({e}); set service.health_url in the spec"
    if address is None:
        return None, "the container reports no IPv4 address (set service.health_url in the spec)"
    return f"http://{address}:{port}", "container address and the service's port"


def _within(seconds: float, work: Callable[[float], Any]) -> tuple[bool, Any, BaseException | None]:
    """Run ``work(deadline)`` in a daemon thread; (finished, result, error). Never waits longer
    than ``seconds`` (plus a hair): a server that trickles bytes cannot stretch it."""
    box: dict[str, Any] = {}
    deadline = time.monotonic() + seconds

    def run() -> None:
        try:
            box["result"] = work(deadline)
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e

    th = threading.Thread(target=run, name="verify http", daemon=True)
    th.start()
    th.join(seconds + 0.05)
    if th.is_alive():
        return False, None, None
    return True, box.get("result"), box.get("error")


def _left(deadline: float) -> float:
    return max(0.01, deadline - time.monotonic())


def _model_id(http: HttpPort, base: str, deadline: float) -> str:
    """The first model the server lists at ``/v1/models``; ``default`` when it lists none."""
    try:
        r = http.request("GET", f"{base}/v1/models", timeout=_left(deadline))
        if r.ok:
            data = r.json().get("data") or []
            if data and data[0].get("id"):
                return str(data[0]["id"])
    except (HttpError, ValueError, AttributeError):
        pass  # the completion reports what is wrong
    return "default"


def _kv_tokens(
    http: HttpPort, base: str, flavor: str | None, deadline: float
) -> tuple[int | None, str | None]:
    """(KV-cache capacity in tokens, where it was read) from the server ``flavor`` names (either
    when None); (None, None) when none reports it."""
    for server, path, source, read in _KV_SOURCES:
        if flavor not in (None, server):
            continue
        try:
            r = http.request("GET", base + path, timeout=_left(deadline))
            kv = read(r) if r.ok else None
        except (HttpError, ValueError):
            kv = None
        if kv is not None:
            return kv, source
    return None, None


def _ask(http: HttpPort, base: str, prompt: str, flavor: str | None, deadline: float) -> dict[str, Any]:
    """One chat completion of ``prompt`` at ``base``, then the KV-cache size: ``latency_s``,
    ``model``, ``status`` and ``content`` (or ``error``), ``kv_tokens`` (and ``kv_source``).
    Raises HttpError when a request gets no reply."""
    model = _model_id(http, base, deadline)
    started = time.monotonic()
    r = http.request(
        "POST",
        f"{base}/v1/chat/completions",
        timeout=_left(deadline),
        json={
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 64,
            "temperature": 0,
        },
    )
    out: dict[str, Any] = {
        "latency_s": round(time.monotonic() - started, 3),
        "model": model,
        "status": r.status,
    }
    if not r.ok:
        out["error"] = f"HTTP {r.status}: {r.text.strip()[:200]}"
        return out
    try:
        out["content"] = str(r.json()["choices"][0]["message"]["content"])
    except (ValueError, KeyError, IndexError, TypeError):
        out["error"] = f"not a chat completion: {r.text.strip()[:200]}"
        return out
    kv, source = _kv_tokens(http, base, flavor, deadline)
    if source is not None:
        out["kv_source"] = source
    out["kv_tokens"] = kv
    return out


def _probe(ctx: Context, vmid: int, svc: Service, details: dict[str, Any]) -> tuple[Status, str]:
    """(verdict, one line) on container ``vmid``'s service ``svc``; what it saw goes into ``details``."""
    v, timeout = ctx.spec.verify, ctx.http_timeout
    ct_state = ctx.container_state(vmid)
    if ct_state is not None and ct_state.status != "running":
        return FAIL, f"CT {vmid} is not running: nothing can answer"
    base, source = endpoint_url(ctx, vmid, svc)
    if base is None:
        return WARN, f"CT {vmid}: no endpoint URL: {source}"
    flavor = server_flavor(ctx.service_command(vmid, svc.unit))
    started = time.monotonic()
    finished, out, error = _within(
        timeout, lambda deadline: _ask(ctx.ports.http, base, v.prompt, flavor, deadline)
    )
    d: dict[str, Any] = {"url": base, "url_source": source, "wall_s": round(time.monotonic() - started, 3)}
    details[str(vmid)] = d
    if not finished:
        return FAIL, f"CT {vmid}: {base} gave no answer within {timeout:g} s"
    if error is not None:
        reason = error.reason if isinstance(error, HttpError) else type(error).__name__
        if reason == "timed out":
            reason = f"no answer within {timeout:g} s"
        d["error"] = str(error).splitlines()[0] if str(error) else type(error).__name__
        return FAIL, f"CT {vmid}: {base}: {reason}"
    d.update(out)
    if "error" in out:
        return FAIL, f"CT {vmid}: {base}/v1/chat/completions: {out['error']}"
    content = " ".join(out["content"].split())
    if not answer_matches(content, v.expect):
        return FAIL, f"CT {vmid}: wrong answer to {v.prompt!r}: {content[:120]!r} (expected {v.expect!r})"
    kv = out.get("kv_tokens")
    ctx.kv_reported[vmid] = kv  # the capacity check compares it with the plan's estimate
    line = f"CT {vmid}: answered {v.expect!r} in {out['latency_s']:.2f} s; " + (
        f"KV cache {kv} tokens" if kv else "KV cache size not reported"
    )
    return (WARN if kv is None else PASS), line


def check(ctx: Context) -> Check:
    """Each service answers the smoke-test prompt within the timeout; no KV-cache figure WARNs."""
    v = ctx.spec.verify
    details: dict[str, Any] = {"prompt": v.prompt, "expect": v.expect, "timeout_s": ctx.http_timeout}
    lines: dict[Status, list[str]] = {PASS: [], WARN: [], FAIL: []}
    why = services_not_run(ctx)
    if why:
        return skipped(NAME, why, details)
    for c, svc, _ in ctx.services():
        status, line = _probe(ctx, c.vmid, svc, details)
        lines[status].append(line)
    # a WARN names the services that passed too
    warnings = lines[WARN] + lines[PASS] if lines[WARN] else []
    return verdict(NAME, details, "; ".join(lines[PASS]), lines[FAIL], warnings)
