"""docs/watch-alerts.yml, the example alert rules: promtool checks them, and runs each alert on
series shaped like what gputopo watch writes (promtool test rules), firing and not firing."""

from __future__ import annotations

import textwrap

import yaml

from helpers import REPO, promtool

RULES = REPO / "docs" / "watch-alerts.yml"
NODE = 'instance="pve1:9100",job="node"'
LABELS = {"instance": "pve1:9100", "job": "node"}
PVE2, PVE2_LABELS = 'instance="pve2:9100",job="node"', {"instance": "pve2:9100"}
PVE3, PVE3_LABELS = 'instance="pve3:9100",job="node"', {"instance": "pve3:9100"}


def test_promtool_checks_the_rules():
    got = promtool.run("check", "rules", RULES)
    assert got.returncode == 0, got.stdout + got.stderr


def _fired(alert: str, at: str, **labels: str) -> dict:
    return {"eval_time": at, "alertname": alert, "exp_alerts": [{"exp_labels": {**LABELS, **labels}}]}


def _silent(alert: str, at: str) -> dict:
    return {"eval_time": at, "alertname": alert, "exp_alerts": []}


def test_each_alert_fires_on_what_the_watch_writes_and_only_then(tmp_path):
    rules = yaml.safe_load(RULES.read_text())
    names = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    series = [
        # a mapping edited by hand at minute 5 and left so
        {"series": f'gputopo_drift{{{NODE},area="mappings"}}', "values": "0x4 1x30"},
        {"series": f'gputopo_drift{{{NODE},area="driver_bindings"}}', "values": "0x35"},
        {"series": f'gputopo_check{{{NODE},check="container"}}', "values": "1x35"},
        {"series": f'gputopo_check{{{NODE},check="vm"}}', "values": "1x4 0x30"},
        # one GPU of two, held by CT 101, gone at minute 20 (no apply ever)
        {"series": f"gputopo_gpus{{{NODE}}}", "values": "2x19 1x15"},
        {
            "series": f'gputopo_gpu_owner{{{NODE},address="0000:01:00.0",owner="container:101"}}',
            "values": "1x35",
        },
        {
            "series": f'gputopo_gpu_owner{{{NODE},address="0000:81:00.0",owner="container:101"}}',
            "values": "1x19 stale",
        },
        {"series": f"gputopo_watch_up{{{NODE}}}", "values": "1x35"},
        # an apply from minute 1 to 3, then nothing unfinished; passes stop being written at minute 10
        {"series": f"gputopo_apply_in_progress{{{NODE}}}", "values": "0 1 1 0x32"},
        {"series": f'gputopo_last_apply_outcome{{{NODE},outcome="unfinished"}}', "values": "0 1 1 0x32"},
        {"series": f'gputopo_last_apply_outcome{{{NODE},outcome="needs-human"}}', "values": "0x35"},
        {"series": f"gputopo_watch_last_run_timestamp_seconds{{{NODE}}}", "values": "0+60x10 600x25"},
        # pve2: a rollback that did not complete, nothing running; pve3: an apply that never ends
        {"series": f'gputopo_last_apply_outcome{{{PVE2},outcome="needs-human"}}', "values": "1x35"},
        {"series": f"gputopo_apply_in_progress{{{PVE2}}}", "values": "0x35"},
        {"series": f"gputopo_apply_in_progress{{{PVE3}}}", "values": "1x80"},
        {"series": f"gputopo_watch_up{{{PVE3}}}", "values": "1x10 0x70"},
    ]
    checks = [
        _silent("GputopoDrift", "10m"),  # 'for: 10m' not yet over
        _fired("GputopoDrift", "16m", area="mappings", severity="warning"),
        _fired("GputopoCheckFailing", "16m", check="vm", severity="warning"),
        _silent("GputopoGpuGone", "19m"),
        _silent("GputopoGpuGone", "23m"),  # 'for: 5m' not yet over
        _fired("GputopoGpuGone", "26m", address="0000:81:00.0", severity="critical"),
        # pve1's apply was unfinished only while it ran
        _fired("GputopoApplyNeedsHuman", "30m", **PVE2_LABELS, outcome="needs-human", severity="critical"),
        _silent("GputopoApplyRunningLong", "30m"),
        _fired("GputopoApplyRunningLong", "70m", **PVE3_LABELS, severity="warning"),
        _silent("GputopoWatchDown", "20m"),
        _fired("GputopoWatchDown", "30m", **PVE3_LABELS, severity="warning"),
        _silent("GputopoWatchStale", "20m"),
        _fired("GputopoWatchStale", "26m", severity="warning"),
    ]
    assert {c["alertname"] for c in checks} == names  # every alert of the file is exercised
    for c in checks:
        for a in c["exp_alerts"]:
            a["exp_annotations"] = _annotations(rules, c["alertname"], a["exp_labels"])
    test = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": checks}],
    }
    path = tmp_path / "watch-alerts.test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    got = promtool.run("test", "rules", path)
    assert got.returncode == 0, textwrap.shorten(got.stdout + got.stderr, 4000)


def test_a_gpu_lost_pages_and_a_planned_removal_does_not(tmp_path):
    """GputopoGpuGone: pve1's GPU, held by its container, falls off the bus after the last apply
    (fires once 'for: 5m' is over); pve2's is pulled, then a spec without it applied; pve3's is
    released by an apply (owner free), then pulled: both planned, both silent."""
    rules = yaml.safe_load(RULES.read_text())

    def owner(node: str, address: str, who: str, values: str) -> dict:
        return {"series": f'gputopo_gpu_owner{{{node},address="{address}",owner="{who}"}}', "values": values}

    series = [
        {"series": f"gputopo_last_apply_timestamp_seconds{{{NODE}}}", "values": "60x40"},
        {"series": f"gputopo_gpus{{{NODE}}}", "values": "2x9 1x30"},
        owner(NODE, "0000:01:00.0", "container:101", "1x40"),
        owner(NODE, "0000:81:00.0", "container:101", "1x9 stale"),
        # pve2: pulled at minute 5 (the node down meanwhile), the spec without it applied at 8
        {"series": f"gputopo_last_apply_timestamp_seconds{{{PVE2}}}", "values": "0x7 480x32"},
        {"series": f"gputopo_gpus{{{PVE2}}}", "values": "2x4 stale _x1 1x32"},
        owner(PVE2, "0000:01:00.0", "container:102", "1x4 stale _x1 1x32"),
        owner(PVE2, "0000:81:00.0", "container:102", "1x4 stale"),
        # pve3: an apply at minute 3 releases it (free), pulled at minute 10
        {"series": f"gputopo_last_apply_timestamp_seconds{{{PVE3}}}", "values": "0x2 180x37"},
        {"series": f"gputopo_gpus{{{PVE3}}}", "values": "2x9 1x30"},
        owner(PVE3, "0000:01:00.0", "container:103", "1x40"),
        owner(PVE3, "0000:81:00.0", "container:103", "1x2 stale"),
        owner(PVE3, "0000:81:00.0", "free", "_x3 1x6 stale"),
    ]
    fired = _fired("GputopoGpuGone", "16m", address="0000:81:00.0", severity="critical")
    checks = [_silent("GputopoGpuGone", "13m"), fired, fired | {"eval_time": "39m"}]
    for c in checks:
        for a in c["exp_alerts"]:
            a["exp_annotations"] = _annotations(rules, c["alertname"], a["exp_labels"])
    test = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": checks}],
    }
    path = tmp_path / "gpu-gone.test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    got = promtool.run("test", "rules", path)
    assert got.returncode == 0, textwrap.shorten(got.stdout + got.stderr, 4000)


def _annotations(rules: dict, alert: str, labels: dict) -> dict:
    """The alert's annotations as Prometheus fills their templates for these labels (promtool
    compares them too): ``{{ $labels.X }}``, and ``{{ $value }}``, the GPU count it fired at."""
    rule = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == alert)
    out = {}
    for key, template in rule.get("annotations", {}).items():
        text = template
        for name, value in labels.items():
            text = text.replace(f"{{{{ $labels.{name} }}}}", value)
        if "{{ $value }}" in text:
            text = text.replace("{{ $value }}", "7")
        out[key] = text
    return out
