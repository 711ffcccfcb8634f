"""Boot a real Linux kernel under QEMU and run Python in it against the real ``/sys``.

The guest is Debian's stock kernel package (``apt-get download linux-image-<ver>-amd64``,
unmodified) with a busybox initramfs holding just the modules the checks need. It is built
once into a cache directory (``GPUTOPO_E2E_CACHE``, default ``~/.cache/gputopo-e2e``) keyed by
the kernel package and a hash of what goes into the initramfs, and reused after that.

Python in the guest is the very interpreter that runs the tests: its prefix, the host's
``/usr`` (libc and friends) and the repository are shared read-only over virtio-9p and
mounted at the same paths they have on the host, so the editable install and every compiled
extension (pydantic_core) work unchanged. One more share, read-write, carries results back.

Machine (QEMU q35, TCG, emulated Intel IOMMU, two NUMA nodes from PCI expander bridges):

=============  ==========================================  ====  ==============================
guest address  device                                      NUMA  why
=============  ==========================================  ====  ==============================
00:01.0        VGA 1234:1111 class 030000 (bochs-drm)      -1    root bus has no _PXM
01:00.0        e1000e behind a root port                   -1    an onboard NIC
02:00.0        e1000 8086:100e behind a root port          -1    identical pair: a pinned card
03:00.0        e1000 8086:100e behind a root port          -1    and its twin (guest/persistence.py)
21:00.0/.1     bochs-display 1234:1111 + ich9-intel-hda    0     GPU + HDMI-audio stand-in,
                                                                 one IOMMU group
22:00.0/.1     two-function e1000e                         0     shared group, no ACS
23:00.0        nvme 1b36:0010                              0
81:00.0        virtio-vga 1af4:1050                        1     virtio-pci driver
82:00.0/.1     bochs-display + ich9-intel-hda              1     second GPU stand-in
83:00.0        e1000e with subsystem vendor 0x10de         1
84:00.0        nvme                                        1
85:00.0        edu 1234:11e8                               1     no driver at all
00:0a.0...     virtio-9p shares                            -1    (renumber IOMMU groups)
=============  ==========================================  ====  ==============================

Run the tests with ``python -m pytest -m e2e tests/e2e`` (one boot for the whole session).
Environment: ``GPUTOPO_E2E_CACHE`` (image cache), ``GPUTOPO_E2E_KPKG`` (kernel package, default
what ``linux-image-amd64`` depends on), ``GPUTOPO_E2E_BUSYBOX`` (a static busybox),
``GPUTOPO_E2E_TIMEOUT`` (seconds for the guest run, default 900), ``GPUTOPO_E2E_REQUIRE=1``
(fail instead of skipping when QEMU or the kernel cannot be had).

Host tools: qemu-system-x86_64, busybox (static), dpkg, apt-get/apt-cache, modprobe + depmod
(kmod), systemd-udevd + udevadm (the guest runs them and kmod from the shared ``/usr``).
Debian/Ubuntu packages: qemu-system-x86 busybox-static kmod udev (dpkg and apt are there).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
GUEST_DIR = HERE / "guest"
REPO = HERE.parent.parent

MODULES = [
    "vfio",
    "vfio_iommu_type1",
    "vfio-pci",
    "pci-stub",
    "e1000e",
    "nvme",
    "virtio_pci",
    "9p",
    "9pnet_virtio",
    "bochs",
    "virtio-gpu",
    "snd-hda-intel",
    "e1000",
]

# Files that go into the initramfs; their content is part of the cache key.
_INITRAMFS_INPUTS = [GUEST_DIR / "init"]
_BUILD_FORMAT = "3"  # bump when the way the image is built changes


class E2EUnavailable(Exception):
    """QEMU or a guest kernel cannot be had on this machine: the e2e tests are skipped."""


class GuestFailed(Exception):
    """The guest booted but did not finish its run (crash, timeout, no exit marker)."""


@dataclass
class GuestImage:
    kernel: Path
    initrd: Path
    kver: str
    built_s: float = 0.0  # seconds spent building it now; 0.0 when it came from the cache


@dataclass
class GuestRun:
    rc: int
    output: str  # the guest command's stdout+stderr (second UART)
    console: str  # kernel console (first UART)
    out_dir: Path  # the read-write share, as the host sees it
    wall_s: float
    qemu_cmd: list[str] = field(default_factory=list)


def cache_dir() -> Path:
    """The image cache: ``$GPUTOPO_E2E_CACHE`` or ``~/.cache/gputopo-e2e``."""
    env = os.environ.get("GPUTOPO_E2E_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "gputopo-e2e"


def find_qemu() -> str:
    """Path of qemu-system-x86_64. Raises :class:`E2EUnavailable` when there is none."""
    q = shutil.which("qemu-system-x86_64")
    if not q:
        raise E2EUnavailable("qemu-system-x86_64 not found (apt-get install qemu-system-x86)")
    return q


def _is_static_elf(path: str) -> bool:
    """True when ``path`` is an ELF executable without a program interpreter (PT_INTERP)."""
    with open(path, "rb") as f:
        data = f.read(1 << 16)
    if data[:4] != b"\x7fELF" or data[4] != 2:  # 64-bit only
        return False
    phoff = int.from_bytes(data[0x20:0x28], "little")
    phentsize = int.from_bytes(data[0x36:0x38], "little")
    phnum = int.from_bytes(data[0x38:0x3A], "little")
    for i in range(phnum):
        off = phoff + i * phentsize
        if int.from_bytes(data[off : off + 4], "little") == 3:  # PT_INTERP
            return False
    return True


def find_busybox() -> str:
    """A statically linked busybox. Raises :class:`E2EUnavailable` when there is none."""
    for cand in (
        os.environ.get("GPUTOPO_E2E_BUSYBOX"),
        "/bin/busybox",
        "/usr/bin/busybox",
        shutil.which("busybox"),
    ):
        if cand and os.path.isfile(cand) and _is_static_elf(cand):
            return cand
    raise E2EUnavailable("no statically linked busybox (apt-get install busybox-static)")


def parse_apt_depends(text: str) -> str | None:
    """The ``linux-image-<ver>`` package that ``apt-cache depends linux-image-amd64`` names."""
    for line in text.splitlines():
        parts = line.split()
        if (
            len(parts) >= 2
            and parts[0] in ("Depends:", "|Depends:")
            and parts[1][len("linux-image-") :][:1].isdigit()
        ):
            return parts[1]
    return None


def kernel_package() -> str:
    """The kernel package to boot: ``$GPUTOPO_E2E_KPKG`` or what linux-image-amd64 depends on.

    Raises :class:`E2EUnavailable` when apt cannot say.
    """
    if os.environ.get("GPUTOPO_E2E_KPKG"):
        return os.environ["GPUTOPO_E2E_KPKG"]
    try:
        out = subprocess.run(
            ["apt-cache", "depends", "linux-image-amd64"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise E2EUnavailable(f"apt-cache depends linux-image-amd64: {e}") from e
    pkg = parse_apt_depends(out)
    if not pkg:
        raise E2EUnavailable("apt-cache knows no linux-image-<ver>-amd64 (set GPUTOPO_E2E_KPKG)")
    return pkg


def image_key(kpkg: str) -> str:
    """Cache key: the kernel package plus a hash of everything the initramfs is built from."""
    h = hashlib.sha256(_BUILD_FORMAT.encode())
    h.update(" ".join(MODULES).encode())
    for p in _INITRAMFS_INPUTS:
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return f"{kpkg}-{h.hexdigest()[:12]}"


# --- cpio (newc) ---------------------------------------------------------------------------


class CpioWriter:
    """Writes a newc cpio archive, the format the kernel unpacks as an initramfs."""

    def __init__(self) -> None:
        self.buf = io.BytesIO()
        self.ino = 1

    def _entry(self, name: str, mode: int, data: bytes = b"") -> None:
        nameb = name.encode() + b"\0"
        fields = [self.ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(nameb), 0]
        self.ino += 1
        hdr = b"070701" + b"".join(b"%08x" % v for v in fields)
        self.buf.write(hdr + nameb)
        self.buf.write(b"\0" * (-(len(hdr) + len(nameb)) % 4))
        self.buf.write(data)
        self.buf.write(b"\0" * (-len(data) % 4))

    def dir(self, name: str) -> None:
        self._entry(name, stat.S_IFDIR | 0o755)

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self._entry(name, stat.S_IFREG | mode, data)

    def symlink(self, name: str, target: str) -> None:
        self._entry(name, stat.S_IFLNK | 0o777, target.encode())

    def tree(self, root: Path) -> None:
        """Add every entry under ``root`` (sorted, parents first), keeping modes and links."""
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for n in sorted(dirnames) + sorted(filenames):
                p = Path(dirpath) / n
                rel = str(p.relative_to(root))
                if p.is_symlink():
                    self.symlink(rel, os.readlink(p))
                elif p.is_dir():
                    self.dir(rel)
                else:
                    self.file(rel, p.read_bytes(), stat.S_IMODE(p.stat().st_mode))

    def gz(self, level: int = 6) -> bytes:
        self._entry("TRAILER!!!", 0)
        return gzip.compress(self.buf.getvalue(), compresslevel=level, mtime=0)


# --- image build -------------------------------------------------------------------------


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def _download_deb(kpkg: str, debs: Path) -> Path:
    debs.mkdir(parents=True, exist_ok=True)
    found = sorted(debs.glob(f"{kpkg}_*.deb"))
    if found:
        return found[-1]
    with tempfile.TemporaryDirectory(dir=debs) as tmp:
        try:
            subprocess.run(
                ["apt-get", "download", kpkg],
                cwd=tmp,
                check=True,
                capture_output=True,
                text=True,
                timeout=900,
            )
        except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
            detail = getattr(e, "stderr", "") or str(e)
            raise E2EUnavailable(f"apt-get download {kpkg} failed: {detail.strip()[-300:]}") from e
        got = sorted(Path(tmp).glob("*.deb"))
        if not got:
            raise E2EUnavailable(f"apt-get download {kpkg} produced no .deb")
        dest = debs / got[0].name
        os.replace(got[0], dest)
    return dest


def _module_files(modprobe: str, kx: Path, kver: str) -> list[Path]:
    """Every .ko that MODULES need, dependencies included (host modprobe against the package)."""
    files: set[Path] = set()
    for m in MODULES:
        out = _run([modprobe, "-d", str(kx), "-S", kver, "--show-depends", m]).stdout
        for line in out.splitlines():
            parts = line.split()
            if parts[:1] == ["insmod"]:
                files.add(Path(parts[1]))
    return sorted(files)


def _tool(name: str) -> str:
    for d in ("/usr/sbin", "/sbin", "/usr/bin", "/bin"):
        if os.access(f"{d}/{name}", os.X_OK):
            return f"{d}/{name}"
    p = shutil.which(name)
    if not p:
        raise E2EUnavailable(f"{name} not found (apt-get install kmod)")
    return p


def build_image(cache: Path | None = None, log=lambda s: None) -> GuestImage:
    """Build (or reuse from the cache) the guest kernel + initramfs.

    Returns the :class:`GuestImage`. Raises :class:`E2EUnavailable` when the kernel package or
    a host tool cannot be had; ``subprocess.CalledProcessError`` when a build step fails.
    """
    cache = cache or cache_dir()
    kpkg = kernel_package()
    key = image_key(kpkg)
    img = cache / "images" / key
    if (img / "bzImage").is_file() and (img / "initramfs.cpio.gz").is_file():
        return GuestImage(img / "bzImage", img / "initramfs.cpio.gz", (img / "kver").read_text().strip())
    t0 = time.monotonic()
    busybox = find_busybox()
    modprobe, depmod = _tool("modprobe"), _tool("depmod")
    log(f"e2e: building guest image {key}")
    deb = _download_deb(kpkg, cache / "debs")
    (cache / "images").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache / "images", prefix=".build-") as tmp:
        t = Path(tmp)
        kx = t / "kpkg"
        _run(["dpkg", "-x", str(deb), str(kx)])
        kvers = sorted(p.name for p in (kx / "lib/modules").iterdir())
        if not kvers:
            raise E2EUnavailable(f"{deb.name} holds no /lib/modules")
        kver = kvers[0]
        mods = kx / "lib/modules" / kver
        if not (mods / "modules.dep").is_file():
            _run([depmod, "-b", str(kx), kver])
        root = t / "root"
        for d in (
            "bin",
            "sbin",
            "dev",
            "proc",
            "sys",
            "tmp",
            "run",
            "etc",
            "e2e",
            "usr",
            f"lib/modules/{kver}",
        ):
            (root / d).mkdir(parents=True, exist_ok=True)
        for f in _module_files(modprobe, kx, kver):
            rel = f.relative_to(kx)
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, root / rel)
        for n in ("modules.order", "modules.builtin", "modules.builtin.modinfo"):
            if (mods / n).exists():
                shutil.copy2(mods / n, root / "lib/modules" / kver / n)
        _run([depmod, "-b", str(root), kver])
        shutil.copy2(busybox, root / "bin/busybox")
        applets = _run([busybox, "--list"]).stdout.split()
        for a in applets:
            if a != "busybox":
                (root / "bin" / a).symlink_to("busybox")
        for a in ("modprobe", "insmod", "rmmod", "lsmod", "depmod", "poweroff", "mdev"):
            (root / "sbin" / a).symlink_to("../bin/busybox")
        shutil.copy2(GUEST_DIR / "init", root / "init")
        (root / "init").chmod(0o755)
        (root / "etc/kver").write_text(kver + "\n")
        # Merged-/usr hosts: the dynamic loader and libc resolve through the /usr share.
        (root / "lib64").symlink_to("usr/lib64")
        (root / "lib/x86_64-linux-gnu").symlink_to("/usr/lib/x86_64-linux-gnu")
        cw = CpioWriter()
        cw.tree(root)
        out = t / "out"
        out.mkdir()
        (out / "initramfs.cpio.gz").write_bytes(cw.gz())
        shutil.copy2(kx / "boot" / f"vmlinuz-{kver}", out / "bzImage")
        (out / "kver").write_text(kver + "\n")
        shutil.rmtree(kx)
        try:
            os.rename(out, img)
        except OSError:
            if not (img / "bzImage").is_file():  # lost a race only if the other build finished
                raise
    built = time.monotonic() - t0
    log(f"e2e: guest image built in {built:.1f} s")
    return GuestImage(img / "bzImage", img / "initramfs.cpio.gz", kver, built)


# --- boot ------------------------------------------------------------------------------


def topology_args(full: bool = True) -> list[str]:
    """The QEMU devices of the guest machine (see the module docstring)."""
    if not full:
        return []
    args: list[str] = []
    for i in range(6):  # each NIC gets a dangling hub port: no host networking at all
        args += ["-netdev", f"hubport,id=n{i},hubid={i}"]
    devices = [
        "VGA,bus=pcie.0,addr=01.0",
        "pcie-root-port,id=rp00,bus=pcie.0,addr=02.0,chassis=1,slot=1",
        "e1000e,bus=rp00,addr=00.0,netdev=n0,mac=52:54:00:00:00:01",
        # two identical e1000 cards, each behind its own root port (with I/O space: e1000
        # needs its I/O BAR): the stand-in pair for boot persistence
        "pcie-root-port,id=rp03,bus=pcie.0,addr=03.0,chassis=3,slot=3",
        "e1000,bus=rp03,addr=00.0,netdev=n4,mac=52:54:00:00:00:04",
        "pcie-root-port,id=rp04,bus=pcie.0,addr=04.0,chassis=4,slot=4",
        "e1000,bus=rp04,addr=00.0,netdev=n5,mac=52:54:00:00:00:05",
        "pxb-pcie,id=pxb0,bus=pcie.0,addr=08.0,bus_nr=0x20,numa_node=0",
        "pcie-root-port,id=rp0a,bus=pxb0,addr=00.0,chassis=10,slot=10,io-reserve=0",
        "bochs-display,bus=rp0a,addr=00.0,multifunction=on",
        "ich9-intel-hda,bus=rp0a,addr=00.1",
        "pcie-root-port,id=rp0b,bus=pxb0,addr=01.0,chassis=11,slot=11,io-reserve=0",
        "e1000e,bus=rp0b,addr=00.0,multifunction=on,netdev=n1,mac=52:54:00:00:00:02",
        "e1000e,bus=rp0b,addr=00.1,netdev=n2,mac=52:54:00:00:00:03",
        "pcie-root-port,id=rp0c,bus=pxb0,addr=02.0,chassis=12,slot=12,io-reserve=0",
        "nvme,bus=rp0c,serial=node0nvme",
        "pxb-pcie,id=pxb1,bus=pcie.0,addr=10.0,bus_nr=0x80,numa_node=1",
        "pcie-root-port,id=rp1a,bus=pxb1,addr=00.0,chassis=20,slot=20,io-reserve=0",
        "virtio-vga,bus=rp1a,addr=00.0",
        "pcie-root-port,id=rp1b,bus=pxb1,addr=01.0,chassis=21,slot=21,io-reserve=0",
        "bochs-display,bus=rp1b,addr=00.0,multifunction=on",
        "ich9-intel-hda,bus=rp1b,addr=00.1",
        "pcie-root-port,id=rp1c,bus=pxb1,addr=02.0,chassis=22,slot=22,io-reserve=0",
        "e1000e,bus=rp1c,addr=00.0,netdev=n3,mac=52:54:00:00:01:01,subsys_ven=0x10de",
        "pcie-root-port,id=rp1d,bus=pxb1,addr=03.0,chassis=23,slot=23,io-reserve=0",
        "nvme,bus=rp1d,serial=node1nvme",
        "pcie-root-port,id=rp1e,bus=pxb1,addr=04.0,chassis=24,slot=24,io-reserve=0",
        "edu,bus=rp1e,addr=00.0",
    ]
    for d in devices:
        args += ["-device", d]
    return args


def _covered(path: str, mounted: list[str]) -> bool:
    return any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounted)


def python_shares() -> list[str]:
    """Host directories the guest needs read-only to run this interpreter on this repository.

    ``/usr`` first (libc, the loader), then the interpreter's prefixes, then the repository;
    a path inside one already shared is left out.
    """
    wanted = ["/usr", os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix), str(REPO.resolve())]
    out: list[str] = []
    for p in wanted:
        if not _covered(p, out):
            out.append(p)
    return out


def guest_tools() -> dict[str, str]:
    """Host programs the guest's checks run from the shared directories, as their environment:
    ``GPUTOPO_E2E_KMOD`` (kmod), ``GPUTOPO_E2E_UDEVD`` and ``GPUTOPO_E2E_UDEVADM`` (udev), each
    the real path behind the first candidate found. One that is missing, or outside
    :func:`python_shares`, is left out (the check that needs it reports it unavailable).
    """
    shares = python_shares()
    candidates = {
        "GPUTOPO_E2E_KMOD": [shutil.which("modprobe"), "/sbin/modprobe", "/usr/sbin/modprobe"],
        "GPUTOPO_E2E_UDEVD": ["/usr/lib/systemd/systemd-udevd", "/lib/systemd/systemd-udevd"],
        "GPUTOPO_E2E_UDEVADM": [shutil.which("udevadm"), "/usr/bin/udevadm", "/bin/udevadm"],
    }
    out: dict[str, str] = {}
    for env, paths in candidates.items():
        found = next((p for p in paths if p and os.access(p, os.X_OK)), None)
        if found and _covered(os.path.realpath(found), shares):
            out[env] = os.path.realpath(found)
    return out


def guest_python() -> str:
    """The interpreter path to run in the guest: this one (its path is the same there)."""
    return sys.executable


def boot(
    image: GuestImage,
    script: str,
    out_dir: Path,
    *,
    ro_shares: list[str] | None = None,
    full: bool = True,
    timeout: float = 600.0,
    mem_mb: int = 1024,
) -> GuestRun:
    """Boot the guest, run ``script`` (busybox sh) in it, wait for power-off.

    ``ro_shares`` are host directories mounted read-only at the same path in the guest
    (default :func:`python_shares`); ``out_dir`` is mounted read-write at the same path.
    Returns the :class:`GuestRun` (``rc`` is the script's exit status).
    Raises :class:`E2EUnavailable` when the guest never reached its /init (QEMU or the kernel
    does not work here) and :class:`GuestFailed` when it got there but did not finish.
    """
    qemu = find_qemu()
    ro_shares = python_shares() if ro_shares is None else ro_shares
    out_dir = out_dir.resolve()
    with tempfile.TemporaryDirectory(prefix="gputopo-e2e-") as tmp:
        t = Path(tmp)
        mounts = [(f"ro{i}", p, "ro") for i, p in enumerate(ro_shares)] + [("out", str(out_dir), "rw")]
        cw = CpioWriter()
        cw.dir("e2e")
        cw.file("e2e/mounts", "".join(f"{tag} {p} {m}\n" for tag, p, m in mounts).encode())
        cw.file("e2e/run.sh", script.encode(), 0o755)
        initrd = t / "initrd"
        initrd.write_bytes(image.initrd.read_bytes() + cw.gz(1))
        half = mem_mb // 2
        cmd = [
            qemu,
            "-machine",
            "q35,kernel-irqchip=split",
            "-accel",
            "tcg,thread=multi",
            "-cpu",
            "max",
            "-smp",
            "2,sockets=2,cores=1,threads=1",
            "-m",
            f"{mem_mb}M",
            "-object",
            f"memory-backend-ram,id=mem0,size={half}M",
            "-object",
            f"memory-backend-ram,id=mem1,size={mem_mb - half}M",
            "-numa",
            "node,nodeid=0,cpus=0,memdev=mem0",
            "-numa",
            "node,nodeid=1,cpus=1,memdev=mem1",
            "-nodefaults",
            "-display",
            "none",
            "-no-reboot",
            "-device",
            "intel-iommu,intremap=on",
            "-kernel",
            str(image.kernel),
            "-initrd",
            str(initrd),
            "-append",
            "console=ttyS0 intel_iommu=on iommu=pt panic=-1 quiet loglevel=4",
        ] + topology_args(full)
        for i, (tag, path, mode) in enumerate(mounts):
            ro = ",readonly=on" if mode == "ro" else ""
            cmd += [
                "-fsdev",
                f"local,id=fs{i},path={path},security_model=none,multidevs=remap{ro}",
                "-device",
                f"virtio-9p-pci,fsdev=fs{i},mount_tag={tag},bus=pcie.0,addr={0x0A + i:02x}.0",
            ]
        console, output = t / "console.log", t / "out.log"
        cmd += ["-serial", f"file:{console}", "-serial", f"file:{output}"]
        t0 = time.monotonic()
        deadline = t0 + timeout
        # a guest kernel that has not reached /init within INIT_LIMIT s is stuck in its boot (a
        # host starved of CPU can stall TCG's early boot for good: "task swapper/0:1 blocked"):
        # it is booted once more, within the same overall timeout
        for attempt in range(BOOT_ATTEMPTS):
            qrc, qerr = _run_qemu(cmd, console, deadline, init_limit=INIT_LIMIT)
            con = console.read_text(errors="replace") if console.exists() else ""
            if "E2E_INIT_UP" in con or attempt + 1 == BOOT_ATTEMPTS or time.monotonic() >= deadline:
                break
            print(
                f"e2e: the guest did not reach /init in {INIT_LIMIT:.0f} s; booting it again", file=sys.stderr
            )
        wall = time.monotonic() - t0
        out = output.read_text(errors="replace") if output.exists() else ""
    rc = parse_exit_marker(out)
    if "E2E_INIT_UP" not in con:
        raise E2EUnavailable(
            f"the guest never reached /init (qemu rc={qrc}, {wall:.0f} s): "
            f"{_tail(qerr, 3)} | console: {_tail(con, 5)}"
        )
    if rc is None:
        why = "timed out" if qrc is None else f"qemu exited {qrc}"
        raise GuestFailed(
            f"guest run {why} without an exit marker after {wall:.0f} s\n"
            f"--- output\n{_tail(out, 40)}\n--- console\n{_tail(con, 40)}\n--- qemu\n{_tail(qerr, 10)}"
        )
    return GuestRun(rc, strip_exit_marker(out), con, out_dir, wall, cmd)


BOOT_ATTEMPTS = 2
INIT_LIMIT = float(os.environ.get("GPUTOPO_E2E_INIT_LIMIT", "300"))  # an idle host reaches /init in ~10 s


def _run_qemu(cmd: list[str], console: Path, deadline: float, init_limit: float) -> tuple[int | None, str]:
    """Run QEMU until it exits or ``deadline``; stop it early when the console shows no
    ``E2E_INIT_UP`` after ``init_limit`` s. Returns (its exit status, None when it was stopped;
    its stderr)."""
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, text=True)
        try:
            while proc.poll() is None:
                now = time.monotonic()
                if now >= deadline:
                    break
                if now - start > init_limit and "E2E_INIT_UP" not in (
                    console.read_text(errors="replace") if console.exists() else ""
                ):
                    break
                time.sleep(0.5)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
                rc = None
            else:
                rc = proc.returncode
        err.seek(0)
        return rc, err.read()


def parse_exit_marker(text: str) -> int | None:
    """The guest script's exit status from its ``E2E_EXIT=<rc>`` line, or None when absent."""
    rc = None
    for line in text.splitlines():
        if line.startswith("E2E_EXIT="):
            try:
                rc = int(line[len("E2E_EXIT=") :].strip())
            except ValueError:
                pass
    return rc


def strip_exit_marker(text: str) -> str:
    return "".join(l for l in text.splitlines(keepends=True) if not l.startswith("E2E_EXIT="))


def _tail(text: str, n: int) -> str:
    return "\n".join((text or "").strip().splitlines()[-n:])


def python_script(argv: list[str], env: dict[str, str] | None = None) -> str:
    """A guest shell script that runs this interpreter with ``argv`` on the shared repository."""
    import shlex

    base = {
        "PYTHONPATH": str(REPO.resolve()),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "HOME": "/tmp",
        "LANG": "C.UTF-8",
        "PATH": f"{os.path.dirname(guest_python())}:/usr/bin:/bin:/sbin",
    }
    base.update(env or {})
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in base.items())
    return f"#!/bin/sh\n{exports}exec {shlex.join([guest_python(), *argv])}\n"
