#!/usr/bin/python
"""Ansible module: bring a Proxmox VE node to a gputopo spec (wraps the gputopo CLI)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: topology
short_description: Bring a Proxmox VE node's GPUs to a gputopo spec
description:
  - Runs C(gputopo) on the node itself, the only place where GPU drivers can be bound.
  - It first plans (C(gputopo plan --json)); the plan's warnings become the task's warnings.
    In check mode it stops there and reports C(changed) when the plan has actions; with
    C(--diff) it shows every file and config before and after (C(gputopo diff --json)).
  - Otherwise it applies exactly that plan (C(gputopo apply --yes --json --expect-plan)) with
    preflight, the host lock, journaled steps, rollback of that node on any failure, then
    C(gputopo verify). C(changed) is true only when steps ran (a plan holding only the HA
    placement of the VMs using this node's GPUs is a change too); a second run on a converged
    node changes nothing.
  - With O(verify=true) a node that needs no change is verified as well (C(gputopo verify));
    a FAIL there fails the task with C(changed=false).
  - "A failure reports the one-line reason gputopo gives (C(msg)), naming this module's options
    where gputopo names its own command-line options, and gputopo's exit status (C(rc)), with
    the apply document's essentials (C(result)) and the end of gputopo's stderr, not its whole
    output. A failed apply is C(changed) when steps ran and something stays changed: a step
    not undone, or one whose undo did not hold (C(undo-incomplete), a service left down)."
  - "For a cluster, run it with C(serial: 1) and C(max_fail_percentage: 0) so that the first
    failing node stops the rollout (see the collection's C(playbooks/rolling_apply.yml))."
  - "By default gputopo reaches Proxmox through C(pvesh) on the node. O(api_host) or O(api_url)
    reach the node's API over HTTPS instead, with the connection options named as
    C(community.proxmox)'s modules name them; secrets go to gputopo through its environment,
    never its command line. Unlike C(community.proxmox), no E(PROXMOX_*) environment variable is
    read: an option given by accident would turn a node's C(pvesh) into an HTTPS login."
version_added: "0.1.0"
options:
  spec:
    description: Path of the spec file on the node.
    type: path
  spec_content:
    description:
      - The spec itself (YAML text), written to a private temporary file on the node.
      - "Use it from a playbook with C(lookup('file', ...)): check mode then plans the spec the
        controller holds, even on a node that has never seen it."
    type: str
  node:
    description: Proxmox node name in the spec (by default the spec's only node, else the host name).
    type: str
  verify:
    description:
      - Run C(gputopo verify) after applying, and on a node that needs no change; a FAIL fails the
        task.
    type: bool
    default: true
  sim:
    description: Rehearse on a simulated node (C(gputopo sim create)) instead of this host.
    type: path
  api_host:
    description:
      - Reach the Proxmox API of this node at C(https://API_HOST:API_PORT) instead of C(pvesh).
      - Mutually exclusive with O(api_url) and O(sim).
    type: str
  api_port:
    description: The API's port with O(api_host) (gputopo's default is 8006).
    type: int
  api_url:
    description:
      - The Proxmox API as a URL, C(https://HOST[:PORT]), instead of O(api_host) and O(api_port).
    type: str
  api_user:
    description: The user to log in as (gputopo's default is C(root@pam)).
    type: str
  api_password:
    description:
      - The password of O(api_user) (a ticket login; only C(root@pam) may change a container's
        devices).
      - Passed to gputopo as E(GPUTOPO_PVE_PASSWORD) in its environment.
    type: str
  api_token_id:
    description:
      - The API token's id (C(gputopo)), or its full id as the web UI shows it
        (C(root@pam!gputopo)).
    type: str
  api_token_secret:
    description:
      - The API token's secret; passed to gputopo as E(GPUTOPO_PVE_TOKEN_SECRET) in its
        environment.
    type: str
  validate_certs:
    description:
      - Check the API's TLS certificate (against the system's CAs, O(ca_bundle), or the pinned
        O(fingerprint)).
      - "V(false) checks nothing: anyone on the way can read the credentials (the task warns)."
    type: bool
    default: true
  ca_bundle:
    description:
      - CA certificate(s) on the node to check the API's certificate with, for example the
        cluster's own C(/etc/pve/pve-root-ca.pem).
    type: path
    aliases: [ca_path]
  fingerprint:
    description:
      - Trust only the API certificate with this SHA-256 fingerprint (C(AA:BB:...), 32 pairs), as
        Proxmox's own clients pin a node; the node's certificate view and C(GET /nodes) show it.
      - Excludes O(ca_bundle) and O(validate_certs=false).
    type: str
  api_timeout:
    description: Seconds per Proxmox API call (gputopo's default is 60).
    type: float
  sysfs_timeout:
    description: Seconds one sysfs write may take.
    type: float
    default: 30
  executable:
    description: The gputopo command.
    type: str
    default: gputopo
attributes:
  check_mode:
    description: Can run in check mode and return changed status prediction without modifying target.
    support: full
    details:
      - Plans only (C(gputopo plan)); nothing is changed, no lock is taken.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check mode), when in diff mode.
    support: full
    details:
      - Every file and Proxmox config before and after (C(gputopo diff)).
  platform:
    description: Target OS/families that can be operated against.
    support: full
    platforms: Proxmox VE 8 and 9 nodes (Debian)
requirements:
  - gputopo on the managed node (the version the cluster runs)
author:
  - gputopo (@gputopo)
"""

EXAMPLES = r"""
- name: Bring the node to the cluster spec
  gputopo.proxmox.topology:
    spec_content: "{{ lookup('file', 'cluster.yaml') }}"
    node: "{{ inventory_hostname }}"

- name: The same over the node's API, its certificate pinned
  gputopo.proxmox.topology:
    spec: /etc/gputopo/spec.yaml
    api_host: "{{ inventory_hostname }}"
    api_user: root@pam
    api_password: "{{ vault_pve_root_password }}"
    fingerprint: "{{ pve_cert_fingerprint }}"
"""

RETURN = r"""
status:
  description: What the module did (V(applied), V(no-changes), or V(check) in check mode).
  returned: always
  type: str
  sample: applied
node:
  description: The Proxmox node that was planned.
  returned: always
  type: str
  sample: pve1
actions:
  description: The plan's actions, one line each.
  returned: always
  type: list
  elements: str
signature:
  description: The plan's signature (C(gputopo apply --expect-plan)); the one applied.
  returned: always
  type: str
steps:
  description: Each step that ran, with its phase, status and seconds; empty when none ran.
  returned: always
  type: list
  elements: dict
verify:
  description:
    - The verification (gputopo's verify document, with C(ok) and C(summary)); empty when it did
      not run (check mode, O(verify=false)).
  returned: always
  type: dict
"""

import json
import os
import re
import tempfile

from ansible.module_utils.basic import AnsibleModule

ARGUMENT_SPEC = dict(
    spec=dict(type="path"),
    spec_content=dict(type="str"),
    node=dict(type="str"),
    verify=dict(type="bool", default=True),
    sim=dict(type="path"),
    api_host=dict(type="str"),
    api_port=dict(type="int"),
    api_url=dict(type="str"),
    api_user=dict(type="str"),
    api_password=dict(type="str", no_log=True),
    api_token_id=dict(type="str", no_log=False),
    api_token_secret=dict(type="str", no_log=True),
    validate_certs=dict(type="bool", default=True),
    ca_bundle=dict(type="path", aliases=["ca_path"]),
    fingerprint=dict(type="str"),
    api_timeout=dict(type="float"),
    sysfs_timeout=dict(type="float", default=30),
    executable=dict(type="str", default="gputopo"),
)

# options that only an HTTPS API uses (validate_certs: only its non-default false)
API_ONLY = (
    "api_port",
    "api_user",
    "api_password",
    "api_token_id",
    "api_token_secret",
    "ca_bundle",
    "fingerprint",
)

ENV_PASSWORD = "GPUTOPO_PVE_PASSWORD"
ENV_TOKEN = "GPUTOPO_PVE_TOKEN"
ENV_TOKEN_SECRET = "GPUTOPO_PVE_TOKEN_SECRET"


def module_words(text, params, spec_file=None):
    """``text`` (gputopo's words) naming this module's options where gputopo names its own;
    ``spec_file``: the temporary file holding O(spec_content), named as that option."""
    if spec_file:
        text = text.replace(spec_file, "spec_content")
    words = [
        ("--node", "node"),
        ("--sim", "sim"),
        ("--ca-bundle", "ca_bundle"),
        ("--fingerprint", "fingerprint"),
        ("--insecure", "validate_certs=false"),
        ("--token-name", "api_token_id"),
        ("--user", "api_user"),
        ("--api-url", "api_host" if params.get("api_host") else "api_url"),
        ("--api-timeout", "api_timeout"),
        (ENV_TOKEN_SECRET, "api_token_secret"),
        (ENV_PASSWORD, "api_password"),
    ]
    for cli, option in words:
        text = re.sub(r"(?<![\w-])%s(?![\w-])" % re.escape(cli), option, text)
    return text


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


def tail(text, limit=4000):
    """The last whole lines of ``text`` within ``limit`` characters: what a failed task keeps of
    gputopo's output (its error line is last; the step-by-step progress before it is not kept)."""
    text = (text or "").rstrip("\n")
    if len(text) <= limit:
        return text
    cut = text[-limit:]
    return cut[cut.find("\n") + 1 :] if "\n" in cut else cut


def essentials(data):
    """What a failed task keeps of gputopo's apply document: how it ended, the error, the
    journal, the boot commands (the steps and the verification are returned on their own)."""
    keep = (
        "status",
        "exit_code",
        "error",
        "node",
        "changed",
        "signature",
        "journal",
        "stop_window_s",
        "boot",
    )
    return {k: data[k] for k in keep if k in data}


def left_changed(steps):
    """Whether a failed apply left the node changed: a step ran and something it did stays
    (a step not undone, or whose undo did not hold: a service left down)."""
    return any(s.get("status") != "undo-done" for s in steps)


def stderr_warnings(stderr):
    """gputopo's own warnings on stderr ('gputopo: warning: ...'), in order."""
    prefix = "gputopo: warning: "
    return [ln.strip()[len(prefix) :] for ln in (stderr or "").splitlines() if ln.strip().startswith(prefix)]


def api_url(params):
    """The API URL of api_host/api_port or api_url; None: no API (pvesh or the simulator)."""
    if params["api_url"]:
        return params["api_url"]
    if not params["api_host"]:
        return None
    host = params["api_host"]
    if ":" in host and not host.startswith("["):  # an IPv6 address
        host = "[%s]" % host
    return "https://%s:%d" % (host, params["api_port"] or 8006)


def check_params(module, p):
    """Refuse (one line, nothing run) an option that the chosen source would ignore."""
    if p["sim"] and (p["api_host"] or p["api_url"]):
        module.fail_json(msg="sim excludes api_host and api_url (the simulated node serves its own API)")
    if p["api_host"] and p["api_url"]:
        module.fail_json(msg="api_host and api_url exclude each other (api_url names the host)")
    if p["api_port"] is not None and not p["api_host"]:
        module.fail_json(msg="api_port applies to api_host only (api_url names its port)")
    if not (p["api_host"] or p["api_url"]):
        given = [name for name in API_ONLY if p[name] is not None]
        if not p["validate_certs"]:
            given.append("validate_certs=false")
        if given:
            module.fail_json(msg="%s applies to api_host or api_url only" % given[0])
    if p["api_password"] is not None and (p["api_token_id"] or p["api_token_secret"]):
        module.fail_json(
            msg="api_password and api_token_id/api_token_secret exclude each other: log in one way"
        )
    if p["api_token_secret"] is not None and not p["api_token_id"]:
        module.fail_json(msg="api_token_secret needs api_token_id (the token it is the secret of)")
    if p["api_timeout"] is not None and p["sim"]:
        module.fail_json(msg="api_timeout applies to api_host, api_url or pvesh on the node, not to sim")


def source_args(p):
    """Where gputopo reads the host from: the simulator, an API URL, or pvesh on the node."""
    if p["sim"]:
        return ["--sim", p["sim"]]
    url = api_url(p)
    if url is None:
        args = ["--local"]
    else:
        args = ["--api-url", url]
        if p["api_user"]:
            args += ["--user", p["api_user"]]
        if p["api_token_id"]:
            args += ["--token-name", p["api_token_id"]]
        if p["ca_bundle"]:
            args += ["--ca-bundle", p["ca_bundle"]]
        if p["fingerprint"]:
            args += ["--fingerprint", p["fingerprint"]]
        if not p["validate_certs"]:
            args.append("--insecure")
    if p["api_timeout"] is not None:
        args += ["--api-timeout", "%g" % p["api_timeout"]]
    return args


def environment(p):
    """gputopo's environment: the secrets (never on its command line); a token set in the node's
    own environment is set aside when this task logs in its own way."""
    env = {"NO_COLOR": "1"}
    if p["api_password"] is not None:
        env.update({ENV_PASSWORD: p["api_password"], ENV_TOKEN: ""})
    if p["api_token_secret"] is not None:
        env.update({ENV_TOKEN_SECRET: p["api_token_secret"], ENV_TOKEN: ""})
    return env


class Gputopo:
    """Runs gputopo commands for one task: failures in the module's words, warnings collected."""

    def __init__(self, module, exe, common, spec_file=None):
        self.module = module
        self.spec_file = spec_file
        self.exe = exe
        self.common = common
        self.env = environment(module.params)
        self.result = dict(changed=False, status="", node="", actions=[], signature="", steps=[], verify={})
        self.warned = []

    def warn(self, text):
        text = module_words(text, self.module.params, self.spec_file)
        if text not in self.warned:
            self.warned.append(text)
            self.module.warn(text)

    def run(self, command, extra=()):
        argv = [self.exe] + command + list(extra) + self.common
        rc, out, err = self.module.run_command(argv, environ_update=self.env)
        for w in stderr_warnings(err):
            self.warn(w)
        return argv, rc, out, err

    def fail(self, argv, rc, out, err, parsed=False, **extra):
        """Fail the task with gputopo's one-line error, the result so far and the end of its
        output (``parsed``: its stdout was a JSON document already returned, not repeated)."""
        data = dict(self.result)
        data.update(extra)
        self.module.fail_json(
            msg=module_words(one_line(err, out, rc), self.module.params, self.spec_file),
            rc=rc,
            stderr=tail(err),
            cmd=argv,
            **dict(data, **({} if parsed else {"stdout": tail(out)})),
        )

    def json(self, command, extra=(), allowed=(0,)):
        argv, rc, out, err = self.run(command, extra)
        if rc not in allowed:
            self.fail(argv, rc, out, err)
        try:
            return json.loads(out)
        except ValueError:
            self.module.fail_json(
                msg="gputopo %s printed no JSON" % command[0],
                rc=rc,
                stdout=tail(out),
                stderr=tail(err),
                cmd=argv,
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
        argument_spec=ARGUMENT_SPEC,
        mutually_exclusive=[("spec", "spec_content")],
        required_one_of=[("spec", "spec_content")],
        supports_check_mode=True,
    )
    p = module.params
    check_params(module, p)
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
        run(module, Gputopo(module, exe, common, spec_file=tmp))
    finally:
        if tmp is not None:
            os.unlink(tmp)


def run(module, g):
    p = module.params
    result = g.result
    plan = g.json(["plan", "--json"])
    for w in plan.get("warnings", []):
        g.warn(w)
    result.update(
        node=plan.get("node") or "",
        actions=[a.get("description", a.get("kind")) for a in plan.get("actions", [])],
        signature=plan.get("signature") or "",
        status="check",
    )
    if module._diff:
        report = g.json(["diff", "--json"])
        result["diff"] = file_diffs(report.get("changes", {}))
    if module.check_mode:
        result["changed"] = not plan.get("no_changes", True)
        module.exit_json(**result)

    extra = [
        "--yes",
        "--json",
        "--timeout",
        "sysfs=%s" % p["sysfs_timeout"],
        "--expect-plan",
        result["signature"],
    ]
    if not p["verify"]:
        extra.append("--no-verify")
    argv, rc, out, err = g.run(["apply"], extra)
    data = None
    try:
        data = json.loads(out) if out.strip() else None
    except ValueError:
        data = None
    if isinstance(data, dict):
        for w in data.get("warnings", []):
            g.warn(w)
        boot = data.get("boot")
        if boot and not boot.get("ran"):
            g.warn(
                "boot persistence changed: before the next reboot run: %s"
                % "; ".join(" ".join(c) for c in boot.get("commands", []))
            )
        result.update(
            changed=bool(data.get("changed")),
            status=data.get("status") or "error",
            steps=data.get("steps") or [],
            verify=data.get("verify") or {},
        )
        if data.get("status") == "error":  # the steps that ran, as the rollback left them
            result["changed"] = left_changed(result["steps"])
    if rc != 0:
        g.fail(
            argv,
            rc,
            out,
            err,
            parsed=isinstance(data, dict),
            **({"result": essentials(data)} if data else {}),
        )
    if not isinstance(data, dict):
        module.fail_json(
            msg="gputopo apply printed no JSON", rc=rc, stdout=tail(out), stderr=tail(err), cmd=argv
        )
    result["changed"] = data.get("status") == "applied"
    if not result["changed"]:
        result.pop("diff", None)
        if p["verify"] and not result["verify"]:
            # nothing to apply: the node is verified all the same (a smoke test answering wrong
            # on a node that needs no change fails the task)
            vargv, rc, out, err = g.run(["verify", "--json"])
            try:
                verdict = json.loads(out)
            except ValueError:
                verdict = None
            if rc not in (0, 1) or not isinstance(verdict, dict):
                g.fail(vargv, rc, out, err)
            result["verify"] = verdict
            if rc != 0 or not verdict.get("ok", False):
                g.fail(vargv, rc, out, err, parsed=True)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
