"""A test callback: every task result and the recap, as JSON in $GPUTOPO_ANSIBLE_RECORD.

ansible-core ships no machine-readable callback (json lives in ansible.posix); the tests read
what the real run reported from this file: ``{"results": [{host, task, changed, failed, skipped,
result}], "stats": {host: {ok, changed, failures, ...}}}``.
"""

from __future__ import annotations

import json
import os

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: record
type: aggregate
short_description: record task results as JSON for the tests
description: Writes every task result and the recap to the file named by GPUTOPO_ANSIBLE_RECORD.
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "record"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.results = []

    def _add(self, result, status):
        data = dict(result._result)
        data.pop("invocation", None)
        self.results.append(
            {
                "host": result._host.get_name(),
                "task": result._task.get_name(),
                "status": status,
                "result": data,
            }
        )

    def v2_runner_on_ok(self, result):
        self._add(result, "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._add(result, "failed")

    def v2_runner_on_skipped(self, result):
        self._add(result, "skipped")

    def v2_playbook_on_stats(self, stats):
        hosts = sorted(stats.processed.keys())
        out = {"results": self.results, "stats": {h: stats.summarize(h) for h in hosts}}
        with open(os.environ["GPUTOPO_ANSIBLE_RECORD"], "w") as f:
            json.dump(out, f, indent=1, default=str)
