"""udev's side of a driver change in the e2e guest: the events pyudev hears, gputopo's wait for
them, and model names from udev's database. Runs with Debian's systemd-udevd from the shared
``/usr`` (its rules and ``hwdb.bin``), like guest/persistence.py.

Every timestamp is ``CLOCK_BOOTTIME`` in seconds (what ``/proc/uptime`` counts too, so a rule's
program can stamp its own end in the same clock).

The device is the NUMA-0 stand-in GPU with its audio function (one IOMMU group): both go to
vfio-pci and back, with gputopo's Binder. A test rule (:data:`RULE`) stands for the rules a real
host runs there: a program that takes :data:`RULE_S` seconds on the GPU's ``bind`` (the driver
package's rule that makes ``/dev/nvidiaN``) and, on the vfio group's ``add``, a mode for
``/dev/vfio/N`` and the same slow program (the permissions rule of ``/dev/vfio/N``).

:func:`check_follow` runs the real ``gputopo watch --follow --format prometheus`` (a process of
this interpreter) under udevd with no rules of the test's, moves the stand-in pair with a plain
Binder (the watch hears udev itself) and records when the next pass began and when its textfile
was rewritten, next to the kernel's and udev's events of the move.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time

SYS_PCI = "/sys/bus/pci/devices"
RULE_PATH = "/etc/udev/rules.d/99-gputopo-e2e.rules"
MARK = "/run/gputopo-e2e"  # the slow program stamps <MARK>-<kernel name>-<action> when it ends
RULE_S = 1.0
TIMEOUT = 20.0


def now() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def rule(gpu: str) -> str:
    # no double quote inside a rule's value; udev reads "$$" as "$"
    prog = f"/bin/sh -c 'sleep {RULE_S:g}; read up idle < /proc/uptime; echo $$up > {MARK}-%k-$env{{ACTION}}'"
    return (
        f'ACTION=="bind", SUBSYSTEM=="pci", KERNEL=="{gpu}", RUN+="{prog}"\n'
        f'ACTION=="add", SUBSYSTEM=="vfio", KERNEL=="[0-9]*", MODE="0666", RUN+="{prog}"\n'
    )


def stamp(kernel: str, action: str) -> float | None:
    """When the slow program of ``kernel``'s ``action`` ended (None: it has not)."""
    try:
        with open(f"{MARK}-{kernel}-{action}") as f:
            return float(f.read().strip())
    except (OSError, ValueError):
        return None


class Recorder:
    """A pyudev.Monitor on one netlink source in a thread: every event with its arrival time."""

    def __init__(self, source: str):
        import pyudev

        self.source = source
        self.monitor = pyudev.Monitor.from_netlink(pyudev.Context(), source=source)
        self.monitor.filter_by("pci")
        self.monitor.filter_by("vfio")
        self.events: list[dict] = []
        self.stop = threading.Event()
        self.monitor.start()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            d = self.monitor.poll(timeout=0.1)
            if d is not None:
                self.events.append(
                    {
                        "t": now(),
                        "action": d.action,
                        "subsystem": d.subsystem,
                        "name": d.sys_name,
                        "seqnum": d.sequence_number,
                        "driver": d.properties.get("DRIVER"),
                    }
                )

    def close(self) -> list[dict]:
        time.sleep(0.3)  # what is still in the socket
        self.stop.set()
        self.thread.join(2)
        return self.events


class UdevSession:
    """systemd-udevd running (``--daemon``) with the PCI devices coldplugged into its database,
    as a boot leaves them (systemd-udev-trigger); stopped on exit. ``tools`` is
    persistence.Tools (the shared ``/usr``'s udevd and udevadm)."""

    def __init__(self, tools, rules: str = ""):
        self.tools = tools
        self.rules = rules

    def __enter__(self) -> UdevSession:
        # a merged-/usr host's /lib/udev, where Debian's udevd looks for hwdb.bin (its
        # UDEVLIBEXECDIR); this guest's /lib is its initramfs
        if not os.path.lexists("/lib/udev"):
            os.symlink("/usr/lib/udev", "/lib/udev")
        if self.rules:
            os.makedirs(os.path.dirname(RULE_PATH), exist_ok=True)
            with open(RULE_PATH, "w") as f:
                f.write(self.rules)
        self.tools.run(self.tools.udevd_path, "systemd-udevd", "--daemon", "--resolve-names=never")
        self.tools.udevadm("trigger", "--action=add", "--subsystem-match=pci")
        self.tools.settle()
        return self

    def __exit__(self, *exc) -> None:
        self.tools.udevadm("control", "--exit")
        if self.rules and os.path.exists(RULE_PATH):
            os.unlink(RULE_PATH)


class WaitLog:
    """Wraps gputopo's UdevEvents: every event its listeners hand the wait, with the time the
    wait received it (what the wait itself saw, beside the independent :class:`Recorder`)."""

    def __init__(self, inner):
        self.inner = inner
        self.received: list[dict] = []

    def listen(self):
        lst = self.inner.listen()
        if lst is None:
            return None
        log = self.received

        class Logged:
            seqnum = lst.seqnum

            def receive(self, timeout):
                ev = lst.receive(timeout)
                if ev is not None:
                    log.append(
                        {"t": now(), "action": ev.action, "subsystem": ev.subsystem, "name": ev.name}
                        | {"seqnum": ev.seqnum, "driver": ev.driver, "after": lst.seqnum}
                    )
                return ev

            def close(self):
                lst.close()

        return Logged()


def timed_move(binder, members: list[str], to_driver: str | None, natives=None) -> dict:
    """One ``move_group`` with the kernel's and udev's events recorded around it."""
    kernel, udev = Recorder("kernel"), Recorder("udev")
    waited = getattr(binder.events, "received", None)
    if waited is not None:
        waited.clear()
    t0 = now()
    err = None
    try:
        binder.move_group(members, to_driver, False, natives)
    except Exception as e:  # recorded for the host to judge
        err = f"{type(e).__name__}: {e}"
    t1 = now()
    return {
        "members": members,
        "to": to_driver,
        "error": err,
        "started": t0,
        "returned": t1,
        "dev_vfio": sorted(os.listdir("/dev/vfio")) if os.path.isdir("/dev/vfio") else [],
        "vfio_modes": {
            g: oct(os.stat(f"/dev/vfio/{g}").st_mode & 0o777)
            for g in (os.listdir("/dev/vfio") if os.path.isdir("/dev/vfio") else [])
            if g != "vfio"
        },
        "drivers": {m: _driver(m) for m in members},
        "kernel": kernel.close(),
        "udev": udev.close(),
        "waited": list(waited) if waited is not None else None,
    }


def _driver(a: str) -> str | None:
    try:
        return os.path.basename(os.readlink(f"{SYS_PCI}/{a}/driver"))
    except OSError:
        return None


def _clear_marks() -> None:
    for n in os.listdir(os.path.dirname(MARK)):
        if n.startswith(os.path.basename(MARK) + "-"):
            os.unlink(os.path.join(os.path.dirname(MARK), n))


def _udevadm_models(tools, addrs: list[str]) -> dict[str, str]:
    """ID_MODEL_FROM_DATABASE as ``udevadm info`` prints each device's entry."""
    out = {}
    for a in addrs:
        p = tools.udevadm("info", "--query=property", f"{SYS_PCI}/{a}")
        for line in p.stdout.splitlines():
            if line.startswith("ID_MODEL_FROM_DATABASE="):
                out[a] = line.split("=", 1)[1]
    return out


def library_cache(log: list) -> None:
    """Give the guest the loader cache a host has, so that pyudev finds libudev: ctypes'
    ``find_library`` asks ``/sbin/ldconfig -p``, and this guest's ``/etc`` (an initramfs) has
    neither ``ld.so.cache`` nor the multiarch line of ``ld.so.conf``. ``ldconfig`` is the
    shared ``/usr``'s; ``-X`` leaves the read-only libraries' links alone."""
    if os.path.exists("/etc/ld.so.cache"):
        return
    with open("/etc/ld.so.conf", "w") as f:
        f.write("/usr/lib/x86_64-linux-gnu\n")
    os.makedirs("/var/cache/ldconfig", exist_ok=True)
    p = subprocess.run(["/usr/sbin/ldconfig", "-X"], capture_output=True, text=True, timeout=120)
    log.append({"argv": ["ldconfig", "-X"], "rc": p.returncode, "out": (p.stdout + p.stderr)[-500:]})
    if not os.path.lexists("/sbin/ldconfig"):
        os.symlink("/usr/sbin/ldconfig", "/sbin/ldconfig")


def check_udev(tools, gpu: str, audio: str, group: str) -> dict:
    """Move the stand-in pair to vfio-pci and back three ways, under a running udevd with the
    slow test rule: the Binder with gputopo's udev wait (there and back), and the Binder
    without it (the race it closes). Then model names from udev's database."""
    from gputopo.adapters.sysfs import Binder, RealSysfs
    from gputopo.adapters.udev import UdevEvents
    from gputopo.facts.names import udev_names

    library_cache(tools.log)
    addrs = sorted(os.listdir(SYS_PCI))
    obs: dict = {"gpu": gpu, "audio": audio, "group": group, "rule_s": RULE_S, "timeout": TIMEOUT}
    # before the coldplug: only what an earlier udevd processed has an entry in its database
    obs["entries_before_udev"] = [a for a in addrs if os.path.exists(f"/run/udev/data/+pci:{a}")]
    obs["names_before_udev"] = udev_names(addrs)
    natives = {gpu: _driver(gpu), audio: _driver(audio)}
    obs["natives"] = natives
    with UdevSession(tools, rule(gpu)):
        events = UdevEvents("/")
        obs["no_udev"] = events.unavailable()  # None: gputopo hears udev here
        obs["names"] = udev_names(addrs)
        obs["udevadm_names"] = _udevadm_models(tools, addrs)
        waiting = Binder(RealSysfs("/"), "/", TIMEOUT, events=WaitLog(events))
        plain = Binder(RealSysfs("/"), "/", TIMEOUT)
        steps = {}
        for name, b, to in (
            ("wait_to_vfio", waiting, "vfio-pci"),
            ("wait_back", waiting, None),
            ("plain_to_vfio", plain, "vfio-pci"),
            ("plain_back", plain, None),
        ):
            _clear_marks()
            r = timed_move(b, [gpu, audio], to, natives if to is None else None)
            r["stamps"] = {
                "gpu_bind": stamp(gpu, "bind"),
                "group_add": stamp(group, "add"),
            }
            steps[name] = r
            tools.settle()  # the next move starts with udev idle
            r["stamps_after_settle"] = {"gpu_bind": stamp(gpu, "bind"), "group_add": stamp(group, "add")}
        obs["steps"] = steps
    obs["after"] = {a: _driver(a) for a in (gpu, audio)}
    return obs


FOLLOW_PROM = "/run/gputopo-e2e-watch.prom"
FOLLOW_SPEC = "/run/gputopo-e2e-spec.yaml"


def _last_run(path: str) -> float | None:
    """``gputopo_watch_last_run_timestamp_seconds`` of the textfile (Unix time), None while there
    is none; read with prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    for fam in text_string_to_metric_families(text):
        if fam.name == "gputopo_watch_last_run_timestamp_seconds":
            return fam.samples[0].value
    return None


def _next_pass(path: str, after: float | None, limit: float) -> dict:
    """Poll the textfile until a pass newer than ``after`` is in it (at most ``limit`` s): when it
    was seen (boot clock) and when that pass began (its own stamp, Unix time)."""
    deadline = now() + limit
    while now() < deadline:
        got = _last_run(path)
        if got is not None and (after is None or got > after):
            return {"seen": now(), "last_run": got}
        time.sleep(0.02)
    return {"seen": None, "last_run": None}


def _passes(path: str, after: float | None, first_limit: float, quiet: float) -> list[dict]:
    """Every pass newer than ``after`` seen in the textfile: the first within ``first_limit`` s,
    each next one within ``quiet`` s of the one before (a move's events can come in more than
    one burst under emulation, each making a pass)."""
    seen = []
    got = _next_pass(path, after, first_limit)
    while got["last_run"] is not None:
        seen.append(got)
        got = _next_pass(path, got["last_run"], quiet)
    return seen


def check_follow(tools, gpu: str, audio: str, natives: dict) -> dict:
    """``gputopo watch --follow`` hearing udev: the command runs (interval one hour, so only an
    event can make a pass), the stand-in pair goes to vfio-pci and back; for each move, the
    kernel's and udev's events and the pass that followed (when it began, when its file was
    seen). Times: boot clock; ``realtime_minus_boot`` turns the pass's Unix stamp into it."""
    import signal
    import sys

    from gputopo.adapters.sysfs import Binder, RealSysfs
    from gputopo.facts.host import node_name

    library_cache(tools.log)
    with open(FOLLOW_SPEC, "w") as f:
        f.write(
            "apiVersion: gputopo/v1\nkind: GpuTopology\nnodes:\n"
            f"  - name: {node_name('/')}\n    containers:\n"
            "      - {vmid: 101, gpus: {count: 1}}\n"
        )
    if os.path.exists(FOLLOW_PROM):
        os.unlink(FOLLOW_PROM)
    obs: dict = {"gpu": gpu, "audio": audio, "natives": natives, "realtime_minus_boot": time.time() - now()}
    argv = [sys.executable, "-m", "gputopo", "watch", "--follow", "--interval", "3600", "--root", "/"]
    argv += ["--spec", FOLLOW_SPEC, "--format", "prometheus", "-o", FOLLOW_PROM]
    with UdevSession(tools):
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            start = _next_pass(FOLLOW_PROM, None, 300.0)  # an interpreter's start under TCG
            obs["start"] = start
            time.sleep(1.0)  # the monitor is open once the first pass is written; let it settle
            plain = Binder(RealSysfs("/"), "/", TIMEOUT)
            last = start["last_run"]
            for name, to in (("to_vfio", "vfio-pci"), ("back", None)):
                r = timed_move(plain, [gpu, audio], to, natives if to is None else None)
                r["passes"] = _passes(FOLLOW_PROM, last, 30.0, 3.0)
                last = r["passes"][-1]["last_run"] if r["passes"] else last
                obs[name] = r
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                out, err = proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
    obs.update(rc=proc.returncode, stdout=out, stderr=err, after={a: _driver(a) for a in (gpu, audio)})
    return obs
