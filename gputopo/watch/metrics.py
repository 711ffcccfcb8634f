"""A watch pass as Prometheus metrics (node_exporter's textfile format), and as text for people.

The metrics are made with ``prometheus_client`` (a registry holding one collector of this pass)
and written with its ``write_to_textfile``: a temporary file beside the target, renamed over it,
so node_exporter never reads half a file and never picks up the temporary one (it reads only
``*.prom``). docs/watch.md lists the metrics; docs/watch-alerts.yml alerts on
them.

Conventions (https://prometheus.io/docs/practices/naming/): every name starts with
``gputopo_``, times are ``_timestamp_seconds`` and ``_seconds``, states are gauges of 0 or 1, one
series per state with the state in a label (``gputopo_last_apply_outcome{outcome=...}``). A
series that would mean nothing is left out rather than set to 0: no drift or check series while
an apply holds the lock or when the pass could not read the host, no ``area`` of the diff while
the spec cannot be planned, no series for a check that did not run (SKIP).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

from prometheus_client import CollectorRegistry, generate_latest, write_to_textfile
from prometheus_client.core import GaugeMetricFamily, Metric

from gputopo.errors import OutputError
from gputopo.model.documents import FAIL, SKIP, Outcome
from gputopo.watch.run import WatchResult

#: the file written into the textfile directory
TEXTFILE = "gputopo.prom"
#: where Debian's prometheus-node-exporter reads textfiles (its --collector.textfile.directory)
TEXTFILE_DIR = "var/lib/prometheus/node-exporter"

OUTCOMES: tuple[str, ...] = get_args(Outcome)


class _PassCollector:
    """The collector of one :class:`WatchResult` (prometheus_client calls ``collect``)."""

    def __init__(self, result: WatchResult):
        self.result = result

    def collect(self) -> Iterator[Metric]:
        r = self.result
        yield _gauge(
            "gputopo_watch_up",
            "1: the last watch pass read the spec and the host; 0: it could not (journal: why)",
            1 if r.up else 0,
        )
        yield _gauge("gputopo_watch_last_run_timestamp_seconds", "When the last watch pass began", r.time)
        yield _gauge("gputopo_watch_duration_seconds", "How long the last watch pass took", r.seconds)
        yield _gauge(
            "gputopo_apply_in_progress",
            "1: an apply or a recover held the host lock, so no drift or check was read",
            1 if r.apply_in_progress else 0,
        )
        if r.up and not r.apply_in_progress:
            drift = GaugeMetricFamily(
                "gputopo_drift",
                "1: the area differs from the spec (spec: the spec cannot be planned)",
                labels=["area"],
            )
            for area, differs in r.drift.items():
                drift.add_metric([area], 1 if differs else 0)
            yield drift
            check = GaugeMetricFamily(
                "gputopo_check",
                "1: the quick check of verify passes (PASS or WARN); 0: it FAILs",
                labels=["check"],
            )
            for name, c in r.checks.items():
                if c.status != SKIP:
                    check.add_metric([name], 0 if c.status == FAIL else 1)
            yield check
            owner = GaugeMetricFamily(
                "gputopo_gpu_owner",
                "1 for each GPU on the bus and who holds it (container:VMID, vm:MAPPING, vm:#VMID, free)",
                labels=["address", "owner"],
            )
            for address, who in r.owners.items():
                owner.add_metric([address, who], 1)
            yield owner
            yield _gauge("gputopo_gpus", "GPUs on the bus", len(r.owners))
            yield from _capacity(r)
        if r.last_apply is not None:
            if r.last_apply.ended is not None:
                yield _gauge(
                    "gputopo_last_apply_timestamp_seconds",
                    "When the newest apply's journal was last written (its end)",
                    r.last_apply.ended,
                )
            outcome = GaugeMetricFamily(
                "gputopo_last_apply_outcome",
                "1 for how the newest apply ended (gputopo history), 0 for the other outcomes",
                labels=["outcome"],
            )
            for name in OUTCOMES:
                outcome.add_metric([name], 1 if r.last_apply.outcome == name else 0)
            yield outcome


def _capacity(r: WatchResult) -> Iterator[Metric]:
    """The capacity check's figures per container (verify/capacity.py): the predicted weights
    per GPU, the predicted KV-cache tokens, and nvidia-smi's memory used against the predicted
    one as a ratio; nothing when the check did not run."""
    c = r.checks.get("capacity")
    per = {k: v for k, v in (c.details if c is not None and c.status != SKIP else {}).items() if k.isdigit()}
    if not per:
        return
    weights = GaugeMetricFamily(
        "gputopo_capacity_weights_bytes",
        "The served model's weights per GPU at its tensor-parallel size, from its safetensors headers",
        labels=["vmid", "model"],
    )
    kv = GaugeMetricFamily(
        "gputopo_capacity_kv_tokens",
        "KV-cache tokens the plan's estimate predicts for the served model (the engine's pool size)",
        labels=["vmid", "model"],
    )
    used = GaugeMetricFamily(
        "gputopo_capacity_memory_diff_ratio",
        "(nvidia-smi memory used - the predicted static memory) / the predicted, on the busiest GPU",
        labels=["vmid", "model"],
    )
    for vmid, d in sorted(per.items()):
        labels = [vmid, str(d.get("model", ""))]
        weights.add_metric(labels, float(d["predicted_weights_gib"]) * (1 << 30))
        if d.get("predicted_kv_tokens") is not None:
            kv.add_metric(labels, d["predicted_kv_tokens"])
        if d.get("used_diff_pct") is not None:
            used.add_metric(labels, d["used_diff_pct"] / 100)
    yield from (weights, kv, used)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def registry(result: WatchResult) -> CollectorRegistry:
    """A registry holding ``result``'s metrics, and nothing else (no process metrics)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_PassCollector(result))
    return reg


def exposition(result: WatchResult) -> str:
    """``result`` in the text exposition format node_exporter's textfile collector reads."""
    return generate_latest(registry(result)).decode()


def textfile_path(root: str | Path, directory: str | None = None, file: str | None = None) -> Path:
    """Where the metrics go: ``file``, else ``directory``/gputopo.prom, else node_exporter's
    textfile directory under ``root``. Raises OutputError when that directory does not exist."""
    if file is not None:
        path = Path(file)
        where = path.parent
    else:
        where = Path(directory) if directory is not None else Path(root) / TEXTFILE_DIR
        path = where / TEXTFILE
    if not where.is_dir():
        raise OutputError(
            str(path),
            FileNotFoundError(2, f"no directory {where} (is prometheus-node-exporter installed?)"),
        )
    return path


def write_textfile(result: WatchResult, path: str | Path) -> None:
    """Replace ``path`` with ``result``'s metrics in one step. Raises OutputError."""
    try:
        write_to_textfile(str(path), registry(result))
    except OSError as e:
        raise OutputError(str(path), e) from None


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def verdict(result: WatchResult) -> str:
    """The pass in one line: an apply in progress, not checked (why), or its drift and checks."""
    r = result
    if r.apply_in_progress:
        return f"an apply is in progress ({r.lock_holder}); drift is not read meanwhile"
    if not r.up:
        return f"not checked: {r.error}"
    drifted, failed = r.drifted, r.failed
    return "; ".join(
        [
            f"drift in {', '.join(drifted)}" if drifted else "no drift",
            f"{len(failed)} check(s) failing: {', '.join(failed)}" if failed else "quick checks pass",
        ]
    )


def _summary(r: WatchResult, name: str) -> str:
    """Check ``name``'s summary for the text, where a refused plan's converged check says so
    in a few words: the ``spec:`` drift line names the refusal already."""
    summary = r.checks[name].summary
    if name == "converged" and summary.startswith("the spec was refused") and "spec" in r.drifted:
        return "the spec was refused (see spec above)"
    return summary


def text(result: WatchResult) -> str:
    """The pass for people: its verdict in one line, then what differs and what fails."""
    r = result
    who = f"node {r.node}" if r.node else "this node"
    lines = [f"{_utc(r.time)} {who}: {verdict(r)}"]
    if r.up and not r.apply_in_progress:
        for area in r.drifted:
            lines += [f"  {area}: {line}" for line in r.drift_lines.get(area, [])]
        for name in r.failed:
            lines.append(f"  check {name}: {_summary(r, name)}")
        lines += [f"  GPU {a}: {o}" for a, o in r.owners.items()]
    if r.last_apply is not None:
        when = f" at {_utc(r.last_apply.ended)}" if r.last_apply.ended is not None else ""
        lines.append(f"  last apply {r.last_apply.id}: {r.last_apply.outcome}{when}")
    return "\n".join(lines) + "\n"
