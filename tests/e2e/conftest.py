"""One guest boot per test session: every e2e test reads the results of that single run.

The e2e tests are skipped (not failed) when QEMU or a guest kernel cannot be had here: no
``qemu-system-x86_64``, no static busybox, no kernel package, or a guest that never reaches its
``/init``. ``GPUTOPO_E2E_REQUIRE=1`` turns those skips into failures (for CI, where the tests
must really run). Anything that goes wrong after the guest is up is a failure.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness

CHECKS = Path(__file__).resolve().parent / "guest" / "checks.py"


@dataclass(repr=False)
class GuestSession:
    image: harness.GuestImage
    run: harness.GuestRun
    results: dict
    out_dir: Path

    def __repr__(self) -> str:
        return f"GuestSession(kernel={self.image.kver}, rc={self.run.rc}, out={self.out_dir})"

    def data(self, check: str) -> dict:
        """The observations of one guest check; fails the test if the check itself crashed."""
        r = self.results.get(check)
        if r is None:
            pytest.fail(f"guest check {check!r} did not run; guest output:\n{self.run.output[-3000:]}")
        if "error" in r:
            pytest.fail(f"guest check {check!r} crashed in the guest:\n{r['error']}")
        return r["data"]

    def unavailable(self, reason: str):
        """Skip (fail with GPUTOPO_E2E_REQUIRE=1): the guest lacked what a check needs."""
        _unavailable(reason)


def _unavailable(reason: str):
    if os.environ.get("GPUTOPO_E2E_REQUIRE") == "1":
        pytest.fail(f"e2e required but unavailable: {reason}")
    pytest.skip(f"e2e unavailable: {reason}")


def pytest_collection_modifyitems(items):
    """Under pytest-xdist (``--dist loadgroup``, as CI runs) every test that reads the guest runs
    on one worker, so the guest boots once per run, not once per worker."""
    for item in items:
        if "guest" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("e2e-guest"))


@pytest.fixture(scope="session")
def guest_checks():
    """The guest's checks module, loaded on the host (its observers work on any root)."""
    spec = importlib.util.spec_from_file_location("gputopo_e2e_checks", CHECKS)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def guest(tmp_path_factory) -> GuestSession:
    """Build (or reuse) the guest image, boot it once, run every guest check, load results."""
    reporter = sys.stderr
    try:
        harness.find_qemu()
        image = harness.build_image(log=lambda s: print(s, file=reporter))
    except harness.E2EUnavailable as e:
        _unavailable(str(e))
    out = tmp_path_factory.mktemp("e2e-out")
    script = harness.python_script([str(CHECKS), str(out)], env=harness.guest_tools())
    timeout = float(os.environ.get("GPUTOPO_E2E_TIMEOUT", "900"))
    try:
        run = harness.boot(image, script, out, timeout=timeout)
    except harness.E2EUnavailable as e:
        _unavailable(str(e))
    print(f"e2e: guest run took {run.wall_s:.1f} s (image build {image.built_s:.1f} s)", file=reporter)
    res_file = out / "results.json"
    if not res_file.is_file():
        pytest.fail(f"guest wrote no results.json (rc={run.rc}); output:\n{run.output[-4000:]}")
    return GuestSession(image, run, json.loads(res_file.read_text()), out)
