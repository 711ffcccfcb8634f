"""Smaller wire behaviours of a real PVE node, each read in Proxmox's sources and driven through
the simulated API with the real clients (proxmoxer, requests, gputopo's ProxmoxClient)."""

from __future__ import annotations

import hashlib
import ipaddress
import socket
import ssl
import time

import pytest
from cryptography import x509
from proxmoxer import ProxmoxAPI
from proxmoxer.core import ResourceException

from gputopo.adapters.credentials import ApiConfig
from gputopo.adapters.proxmox import ProxmoxClient
from gputopo.errors import ProxmoxError
from gputopo.formats.lxcconf import parse_lxc_conf
from gputopo.formats.pcicfg import parse_pci_cfg
from gputopo.sim import state
from gputopo.sim.pveapi import PveApiServer, PveshSim
from helpers.simapi import seed_root, token_put  # noqa: F401 (fixtures)

# as pct writes it (keys sorted): a rewrite that changes nothing keeps the digest
CT = "arch: amd64\ndev0: /dev/nvidia0,gid=44,mode=0666\nhostname: llm\nmemory: 4096\nostype: ubuntu\n"
MAP = "id=10de:2bb5,iommugroup={g},node=pve1,path=0000:81:00.0,subsystem-id=10de:204e"


def _server(tmp_path, root, **kw) -> PveApiServer:
    kw.setdefault("auth_fail_delay", 0.0)
    s = PveApiServer(tmp_path / "pve", tmp_path / "run", root, **kw)
    s.write_conf("lxc", 101, CT)
    return s.start()


@pytest.fixture
def srv(tmp_path, seed_root):
    s = _server(tmp_path, seed_root)
    yield s
    s.stop()


def _token_api(s: PveApiServer, secret: str | None = None) -> ProxmoxAPI:
    user, tid = s.root_token_id.split("!")
    return ProxmoxAPI(
        "127.0.0.1",
        port=s.port,
        user=user,
        token_name=tid,
        token_value=secret or s.root_token_secret,
        verify_ssl=str(s.ca_cert_path),
    )


def _ticket_api(s: PveApiServer) -> ProxmoxAPI:
    return ProxmoxAPI(
        "127.0.0.1", port=s.port, user="root@pam", password=s.root_password, verify_ssl=str(s.ca_cert_path)
    )


def _err(fn) -> ResourceException:
    with pytest.raises(ResourceException) as ei:
        fn()
    return ei.value


def _group(root, addr: str) -> int:
    return int((root / "sys/bus/pci/devices" / addr / "iommu_group").readlink().name)


# --- 401s come late ------------------------------------------------------------------------


@pytest.mark.slow
def test_a_401_is_answered_after_3_s_by_default_and_after_the_configured_delay(tmp_path, seed_root):
    # pve-http-server AnyEvent.pm authenticate_and_handle_request: "always delay unauthorized
    # calls by 3 seconds"; a bad login at /access/ticket is delayed the same way
    assert PveApiServer(tmp_path / "a" / "pve", tmp_path / "a" / "run", seed_root).auth_fail_delay == 3.0
    s = _server(tmp_path, seed_root, auth_fail_delay=0.4)
    try:
        t0 = time.monotonic()
        assert _token_api(s).version.get()["version"]
        good = time.monotonic() - t0
        t0 = time.monotonic()
        e = _err(lambda: _token_api(s, secret="00000000-0000-0000-0000-000000000000").version.get())
        assert e.status_code == 401 and time.monotonic() - t0 >= 0.4 > good
        cfg = ApiConfig(host="127.0.0.1", port=s.port, ca_bundle=str(s.ca_cert_path), timeout=10)
        t0 = time.monotonic()
        with pytest.raises(ProxmoxError) as ei:
            ProxmoxClient.from_config(cfg, env={"GPUTOPO_PVE_PASSWORD": "wrong-password"})
        assert ei.value.status == 401 and time.monotonic() - t0 >= 0.4
    finally:
        s.stop()


# --- the form body ------------------------------------------------------------------------


def test_an_unencoded_semicolon_in_a_form_body_separates_parameters(srv):
    # pve-http-server AnyEvent.pm decode_urlencoded splits the body on [&;]
    r = token_put(srv, "/nodes/pve1/lxc/101/config", "memory=1024;swap=256")
    assert r.status_code == 200, r.text
    opts = parse_lxc_conf((srv.pve_root / "lxc/101.conf").read_text()).options
    assert (opts["memory"], opts["swap"]) == ("1024", "256")
    r = token_put(srv, "/nodes/pve1/lxc/101/config", "description=GPUs;for the VM")
    assert r.status_code == 400
    assert r.json()["errors"] == {
        "for the VM": "property is not defined in schema and the schema does not allow additional properties"
    }
    # encoded, the same text is one value
    assert (
        token_put(srv, "/nodes/pve1/lxc/101/config", "description=GPUs%3Bfor%20the%20VM").status_code == 200
    )


# --- delete and set together -----------------------------------------------------------------


def test_deleting_and_setting_one_mapping_property_together_is_a_500(srv, seed_root):
    # pve-common SectionConfig.pm delete_from_config dies inside lock_pci_config, which prefixes
    # "update hardware mapping failed: " (pve-manager API2/Cluster/Mapping/PCI.pm update)
    api = _token_api(srv)
    m = MAP.format(g=_group(seed_root, "0000:81:00.0"))
    api.cluster.mapping.pci.post(id="gpu", map=[m], description="old")
    e = _err(lambda: api.cluster.mapping.pci("gpu").put(map=[m], description="new", delete="description"))
    assert (e.status_code, e.content) == (
        500,
        "update hardware mapping failed: cannot set and delete property 'description' at the same time!",
    )
    e = _err(lambda: api.cluster.mapping.pci("gpu").put(map=[m], delete="bogus"))
    assert (e.status_code, e.content) == (500, "update hardware mapping failed: no such option 'bogus'")
    # check_config runs before delete_from_config: without map, the missing map is what fails
    e = _err(lambda: api.cluster.mapping.pci("gpu").put(delete="map"))
    assert e.content == "update hardware mapping failed: missing value for required option 'map'"
    e = _err(lambda: api.cluster.mapping.pci("gpu").put(map=[m], delete="map"))
    assert e.content == "update hardware mapping failed: unable to delete required option 'map'"
    (mp,) = parse_pci_cfg((srv.pve_root / "mapping/pci.cfg").read_text())
    assert mp.description == "old"
    # a container option: pve-container API2/LXC/Config.pm update_vm raises a parameter error
    e = _err(lambda: api.nodes("pve1").lxc(101).config.put(memory=2048, delete="memory"))
    assert e.status_code == 400 and e.errors == {
        "delete": "you can't use '-memory' and -delete memory' at the same time"
    }


# --- deleting what is not set ------------------------------------------------------------


@pytest.mark.parametrize("running", [True, False])
@pytest.mark.slow
def test_deleting_an_unset_key_warns_and_is_skipped(srv, running):
    # pve-container LXC/Config.pm update_pct_config: "cannot delete '$opt' - not set in current
    # configuration!" (a Perl warn: pvesh shows it on stderr and still succeeds)
    if running:
        state.set_guest_status(srv.run_dir, "lxc", 101, "running")
    api = _ticket_api(srv)  # only root@pam may touch devN
    before = api.nodes("pve1").lxc(101).config.get()["digest"]
    api.nodes("pve1").lxc(101).config.put(delete="dev7")
    assert api.nodes("pve1").lxc(101).config.get()["digest"] == before
    assert parse_lxc_conf((srv.pve_root / "lxc/101.conf").read_text()).pending.is_empty()
    pvesh = PveshSim(srv)
    out, err, rc = pvesh(
        ["pvesh", "set", "/nodes/pve1/lxc/101/config", "--delete", "dev7,dev8", "--output-format", "json"], 10
    )
    assert (out, rc) == ("", 0)
    assert err == (
        "cannot delete 'dev7' - not set in current configuration!\n"
        "cannot delete 'dev8' - not set in current configuration!\n"
    )
    # gputopo's local backend: the exit code decides, the warning is not a failure
    local = ProxmoxClient.from_config(ApiConfig(backend="local", timeout=10), env={}, runner=pvesh)
    local.lxc_update(101, {}, ["dev7"], before)
    assert api.nodes("pve1").lxc(101).config.get()["digest"] == before


# --- the certificate -----------------------------------------------------------------------


def test_nodes_reports_the_certificates_sha256_fingerprint_and_the_certificate_names_the_node(srv):
    pem = ssl.get_server_certificate(("127.0.0.1", srv.port))
    der = ssl.PEM_cert_to_DER_cert(pem)
    digest = hashlib.sha256(der).hexdigest().upper()
    want = ":".join(digest[i : i + 2] for i in range(0, 64, 2))
    # pve-manager API2/Nodes.pm index -> PVE::Cluster::get_node_fingerprint -> pve-common
    # Certificate.pm get_certificate_fingerprint (Net::SSLeay X509_get_fingerprint sha256)
    (node,) = _token_api(srv).nodes.get()
    assert node["ssl_fingerprint"] == want
    # pve-cluster gen_pve_ssl_cert: IP:127.0.0.1, IP:::1, DNS:localhost, DNS:<node>
    cert = x509.load_der_x509_certificate(der)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "pve1" in san.get_values_for_type(x509.DNSName)
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    assert {ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")} <= set(
        san.get_values_for_type(x509.IPAddress)
    )


def test_the_certificate_of_another_node_names_that_node(tmp_path, seed_root):
    s = _server(tmp_path, seed_root, node="pve7")
    try:
        der = ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate(("127.0.0.1", s.port)))
        san = x509.load_der_x509_certificate(der).extensions.get_extension_for_class(
            x509.SubjectAlternativeName
        )
        assert "pve7" in san.value.get_values_for_type(x509.DNSName)
        ctx = ssl.create_default_context(cafile=str(s.ca_cert_path))
        with socket.create_connection(("127.0.0.1", s.port), timeout=5) as raw:
            with ctx.wrap_socket(raw, server_hostname="pve7"):
                pass  # the chain and the node's name verify
    finally:
        s.stop()


# --- mapping ids ---------------------------------------------------------------------------


@pytest.mark.slow
def test_mapping_ids_are_pve_configids_of_either_case_and_are_looked_up_exactly(srv, seed_root):
    # pve-common JSONSchema.pm $CONFIGID_RE = qr/[a-z][a-z0-9_-]+/i; pve-guest-common
    # Mapping/PCI.pm keeps the section id as the key of $cfg->{ids}: lookups and the
    # "already defined" check are exact
    c = ProxmoxClient.from_config(
        ApiConfig(host="127.0.0.1", port=srv.port, ca_bundle=str(srv.ca_cert_path)),
        env={"GPUTOPO_PVE_PASSWORD": srv.root_password},
    )
    m = MAP.format(g=_group(seed_root, "0000:81:00.0"))
    c.mapping_create("GPU-vm", [m], None)
    c.mapping_create("gpu-vm", [m], None)
    with pytest.raises(ProxmoxError) as ei:
        c.mapping_create("GPU-vm", [m], None)
    assert ei.value.pve_message == "create hardware mapping failed: pci ID 'GPU-vm' already defined"
    assert sorted(x["id"] for x in c.mappings()) == ["GPU-vm", "gpu-vm"]
    api = _token_api(srv)
    assert api.cluster.mapping.pci("GPU-vm").get()["map"] == [m]
    e = _err(lambda: api.cluster.mapping.pci("GPU-VM").get())
    assert (e.status_code, e.content) == (500, "mapping 'GPU-VM' not found")
    e = _err(lambda: api.cluster.mapping.pci.post(id="9gpu", map=[m]))
    assert e.errors == {"id": "invalid format - invalid configuration ID '9gpu'\n"}
    c.mapping_delete("GPU-VM")  # another id: nothing to delete
    assert len(parse_pci_cfg((srv.pve_root / "mapping/pci.cfg").read_text())) == 2
