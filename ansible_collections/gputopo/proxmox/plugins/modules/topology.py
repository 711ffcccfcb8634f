#!/usr/bin/python
"""Ansible module: bring a Proxmox VE node to a gputopo spec (wraps the gputopo CLI)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: topology
short_description: Bring a Proxmox VE node's GPUs to a gputopo spec
description:
  - Runs C(gputopo) on the node itself, the only place where GPU drivers can be bound.
  - In check mode it plans (C(gputopo plan --json)) and reports C(changed) when the plan has
    actions; with C(--diff) it shows every file and config before and after
    (C(gputopo diff --json)).
  - Otherwise it applies (C(gputopo apply --yes --json)) with preflight, the host lock, journaled
    steps, rollback of that node on any failure, then C(gputopo verify). C(changed) is true only
    when steps ran; a second run on a converged node changes nothing.
  - A failure reports the one-line reason gputopo gives (C(msg)) and its exit status (C(rc)).
  - "For a cluster, run it with C(serial: 1) and C(max_fail_percentage: 0) so that the first
    failing node stops the rollout (see the collection's C(playbooks/rolling_apply.yml))."
version_added: "0.1.0"
options:
  spec:
    description: Path of the spec file on the node.
    type: path
  spec_content:
    description: The spec itself (YAML text), written to a private temporary file on the node.
    type: str
  node:
    description: Proxmox node name in the spec (by default the spec's only node, else the host name).
    type: str
  verify:
    description: Run C(gputopo verify) after applying; a FAIL fails the task.
    type: bool
    default: true
  sim:
    description: Rehearse on a simulated node (C(gputopo sim create)) instead of this host.
    type: path
  api_url:
    description:
      - Reach Proxmox over HTTPS instead of C(pvesh) on the node; secrets come from the
        environment (C(GPUTOPO_PVE_PASSWORD), C(GPUTOPO_PVE_TOKEN)), set with C(environment).
    type: str
  sysfs_timeout:
    description: Seconds one sysfs write may take.
    type: float
    default: 30
  executable:
    description: The gputopo command.
    type: str
    default: gputopo
requirements:
  - gputopo on the managed node (the version the cluster runs)
notes:
  - Supports check mode and diff mode.
author:
  - gputopo
"""

EXAMPLES = r"""
- name: Bring the node to the cluster spec
  gputopo.proxmox.topology:
    spec: /etc/gputopo/cluster.yaml
    node: "{{ inventory_hostname }}"
"""

RETURN = r"""
status:
  description: What the apply did (applied, no-changes, check).
  returned: always
  type: str
actions:
  description: The plan's actions, one line each.
  returned: always
  type: list
  elements: str
signature:
  description: The plan's signature (C(gputopo apply --expect-plan)).
  returned: always
  type: str
steps:
  description: Each step that ran, with its phase, status and seconds.
  returned: when applied
  type: list
  elements: dict
verify:
  description: The verification after the apply (C(ok), C(summary)).
  returned: when applied and verified
  type: dict
"""

import json
import os
import tempfile

from ansible.module_utils.basic import AnsibleModule


def one_line(stderr, stdout, rc):
    """The reason gputopo gave: its 'gputopo: error:' line, else its last line."""
    lines = [ln.strip() for ln in (stderr or "").splitlines() if ln.strip()]
    errors = [ln[len("gputopo: error: ") :] for ln in lines if ln.startswith("gputopo: error: ")]
    refused = [e for e in errors if e.startswith("refused: ")]
    if refused:  # a refused plan: one line per reason, every reason kept
        return "; ".join(refused)
    if errors:
        return errors[-1]
    if lines:
        return lines[-1]
    out = [ln.strip() for ln in (stdout or "").splitlines() if ln.strip()]
    return out[-1] if out else "gputopo exited %d" % rc


def source_args(params):
    """Where gputopo reads the host from: the simulator, an API URL, or pvesh on the node."""
    if params["sim"]:
        return ["--sim", params["sim"]]
    if params["api_url"]:
        return ["--api-url", params["api_url"]]
    return ["--local"]


def run_json(module, argv, allowed=(0,)):
    rc, out, err = module.run_command(argv, environ_update={"NO_COLOR": "1"})
    if rc not in allowed:
        module.fail_json(msg=one_line(err, out, rc), rc=rc, stdout=out, stderr=err, cmd=argv)
    try:
        return rc, json.loads(out)
    except ValueError:
        module.fail_json(
            msg="%s printed no JSON" % " ".join(argv[:2]), rc=rc, stdout=out, stderr=err, cmd=argv
        )


def file_diffs(changes):
    """Ansible's before/after diff, one entry per file or config."""
    out = []
    for path in sorted(changes):
        c = changes[path]
        out.append(
            {
                "before_header": path if c.get("before") is not None else "%s (absent)" % path,
                "after_header": path if c.get("after") is not None else "%s (removed)" % path,
                "before": c.get("before") or "",
                "after": c.get("after") or "",
            }
        )
    return out


def main():
    module = AnsibleModule(
        argument_spec=dict(
            spec=dict(type="path"),
            spec_content=dict(type="str"),
            node=dict(type="str"),
            verify=dict(type="bool", default=True),
            sim=dict(type="path"),
            api_url=dict(type="str"),
            sysfs_timeout=dict(type="float", default=30),
            executable=dict(type="str", default="gputopo"),
        ),
        mutually_exclusive=[("spec", "spec_content"), ("sim", "api_url")],
        required_one_of=[("spec", "spec_content")],
        supports_check_mode=True,
    )
    p = module.params
    exe = (
        module.get_bin_path(p["executable"], required=True) if "/" not in p["executable"] else p["executable"]
    )
    tmp = None
    spec = p["spec"]
    if p["spec_content"] is not None:
        fd, tmp = tempfile.mkstemp(prefix="gputopo-spec-", suffix=".yaml")
        with os.fdopen(fd, "w") as f:
            f.write(p["spec_content"])
        spec = tmp
    try:
        common = ["--spec", spec] + source_args(p) + (["--node", p["node"]] if p["node"] else [])
        result = dict(changed=False)
        if module.check_mode or module._diff:
            _, plan = run_json(module, [exe, "plan", "--json"] + common)
            result.update(
                actions=[a.get("description", a.get("kind")) for a in plan.get("actions", [])],
                signature=None,
                status="check",
            )
            if module._diff:
                _, report = run_json(module, [exe, "diff", "--json"] + common)
                result["diff"] = file_diffs(report.get("changes", {}))
            if module.check_mode:
                result["changed"] = not plan.get("no_changes", True)
                module.exit_json(**result)
        argv = [exe, "apply", "--yes", "--json", "--timeout", f"sysfs={p['sysfs_timeout']}"] + common
        if not p["verify"]:
            argv.append("--no-verify")
        rc, out, err = module.run_command(argv, environ_update={"NO_COLOR": "1"})
        data = None
        try:
            data = json.loads(out) if out.strip() else None
        except ValueError:
            data = None
        if rc != 0:
            module.fail_json(
                msg=one_line(err, out, rc),
                rc=rc,
                stdout=out,
                stderr=err,
                cmd=argv,
                changed=bool(data and data.get("changed")),
                **({"result": data} if data else {}),
            )
        if not isinstance(data, dict):
            module.fail_json(msg="gputopo apply printed no JSON", rc=rc, stdout=out, stderr=err, cmd=argv)
        result.update(
            changed=data.get("status") == "applied",
            status=data.get("status"),
            actions=data.get("plan", []),
            signature=data.get("signature"),
            steps=data.get("steps", []),
            verify=data.get("verify"),
        )
        if not result["changed"]:
            result.pop("diff", None)
        module.exit_json(**result)
    finally:
        if tmp is not None:
            os.unlink(tmp)


if __name__ == "__main__":
    main()
