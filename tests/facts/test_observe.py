"""observe(): a host's facts and current state read in one place, and Proxmox's files answering
the read half of the Proxmox port with the API's shapes and rules."""

from __future__ import annotations

import pytest

from gputopo.adapters.pvefiles import PveFiles
from gputopo.errors import ProxmoxError, SpecError
from gputopo.facts.current import read_current
from gputopo.facts.discover import discover
from gputopo.facts.observe import observe
from gputopo.model.reads import EVERY_GUEST, ContainerRead, Reads
from gputopo.model.state import CurrentState
from gputopo.plan.reads import spec_reads
from gputopo.ports import ProxmoxPort, ProxmoxReadPort
from helpers.applysim import copy_host, seed_spec, template  # noqa: F401 (fixtures)


@pytest.fixture
def host(template, tmp_path):
    h = copy_host(template, tmp_path / "sim")
    h.start()
    yield h
    h.stop()


def test_files_and_api_read_the_same_guests_and_mappings(host):
    ports = host.ports()
    files = PveFiles(host.paths.pve, host.node)
    assert isinstance(files, ProxmoxReadPort) and not isinstance(files, ProxmoxPort)
    api = read_current(EVERY_GUEST, proxmox=ports.proxmox)
    disk = read_current(EVERY_GUEST, proxmox=files)
    assert list(api.containers) == list(disk.containers) == [101]
    assert list(api.guests) == list(disk.guests) == [201]
    # the same file's text behind both: the same digests, the same devices and mapping lines
    assert api.containers[101].config["digest"] == disk.containers[101].config["digest"]
    assert api.guests[201].config["digest"] == disk.guests[201].config["digest"]
    assert api.guests[201].hostpci == disk.guests[201].hostpci == ["mapping=pro6000-vm,pcie=1"]
    assert api.mappings == disk.mappings and "pro6000" in disk.mappings
    # what only the API can tell
    assert api.guest_status_known and api.pve_version
    assert not disk.guest_status_known and disk.pve_version is None


def test_a_stopped_guest_read_from_files_counts_as_running(host):
    ports = host.ports()
    ports.proxmox.guest_action("lxc", 101, "stop", 30)
    reads = Reads(containers=(ContainerRead(101),))
    assert read_current(reads, proxmox=ports.proxmox).containers[101].status == "stopped"
    assert (
        read_current(reads, proxmox=PveFiles(host.paths.pve, host.node)).containers[101].status == "running"
    )


def test_a_container_that_does_not_exist_is_left_out_by_both_sources(host):
    ports = host.ports()
    files = PveFiles(host.paths.pve, host.node)
    for source in (ports.proxmox, files):
        with pytest.raises(ProxmoxError, match="does not exist"):
            source.lxc_config(999)
        state = read_current(Reads(containers=(ContainerRead(999), ContainerRead(101))), proxmox=source)
        assert list(state.containers) == [101]


def test_an_unreadable_container_config_is_an_error_not_a_missing_guest(tmp_path):
    lxc = tmp_path / "nodes" / "pve1" / "lxc"
    lxc.mkdir(parents=True)
    (lxc / "101.conf").write_bytes(b"arch: \xff\n")
    files = PveFiles(tmp_path, "pve1")
    assert files.list_guests("lxc") == []  # left out of the listing, the readable ones still show
    with pytest.raises(ProxmoxError, match="cannot read"):
        read_current(Reads(containers=(ContainerRead(101),)), proxmox=files)


def test_nothing_configured_reads_as_an_empty_state_whose_statuses_are_known(tmp_path):
    assert read_current(EVERY_GUEST, proxmox=PveFiles(tmp_path / "absent", "pve1")) == CurrentState()


class Recording:
    """A read port that records each call and answers like an empty node."""

    node = "pve1"
    status_known = True
    guests_known = True

    def __init__(self):
        self.calls: list[str] = []

    def __getattr__(self, name):
        def call(*args, **kwargs):
            self.calls.append(name)
            return {} if name == "version" else []

        return call


def test_observe_discovers_a_root_and_asks_what_to_read_of_its_facts(host):
    seen = []

    def reads(facts):
        seen.append(facts)
        return Reads(files=("etc/modules-load.d/gputopo-vfio.conf",))

    ports = host.ports()
    facts, current = observe(str(host.paths.root), reads, proxmox=Recording(), files=ports.files)
    assert seen == [facts] and facts.host.hostname and len(facts.gpus) == 8
    assert current.files == {"etc/modules-load.d/gputopo-vfio.conf": None}
    given = discover(str(host.paths.root))
    assert observe(given, reads, proxmox=Recording()).facts is given


def test_observe_refuses_a_spec_without_this_host_before_reading(host):
    spec = seed_spec(host)
    spec.nodes[0].name = "elsewhere"
    port = Recording()
    with pytest.raises(SpecError, match="not this host"):
        observe(str(host.paths.root), spec_reads(spec), proxmox=port)
    assert port.calls == []


def test_spec_reads_names_the_containers_services_vms_and_persistence_files(host):
    spec = seed_spec(host)
    r = spec_reads(spec)(discover(str(host.paths.root)))
    assert [c.vmid for c in r.containers] == [c.vmid for c in spec.nodes[0].containers]
    svc = r.containers[0].service
    assert svc is not None and svc.dropin_path.startswith(f"/etc/systemd/system/{svc.unit}.d/")
    assert "etc/udev/rules.d/90-gputopo-vfio.rules" in r.files
