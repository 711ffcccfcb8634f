"""nvidia-smi parsers against real captures (fixtures/real/, see SOURCES.md) and literal strings."""

import pytest

from gputopo.errors import AddressError, GputopoError, NvsmiParseError
from gputopo.formats.nvsmi import (
    header_cell,
    normalize_bus_id,
    parse_list_gpus,
    parse_nvidia_smi_q,
    parse_query_gpu,
)
from helpers import REPO

REAL = REPO / "fixtures" / "real"
SEED_FIELDS = ["index", "memory.used", "memory.total", "utilization.gpu"]


def test_seed_lines_with_units():
    rows = parse_query_gpu((REAL / "seed-query-gpu.csv").read_text(), SEED_FIELDS)
    assert [r["memory.used"] for r in rows] == [79043, 78369, 78369, 78193]
    assert {r["memory.total"] for r in rows} == {97887}
    assert [r["index"] for r in rows] == [0, 1, 2, 3]
    assert all(r["utilization.gpu"] == 0 for r in rows)


def test_seed_lines_nounits_with_header():
    text = (
        "index, memory.used [MiB], memory.total [MiB], utilization.gpu [%]\n"
        "0, 79043, 97887, 0\n"
        "1, 78369, 97887, 12\n"
    )
    rows = parse_query_gpu(text, SEED_FIELDS)
    assert rows == [
        {"index": 0, "memory.used": 79043, "memory.total": 97887, "utilization.gpu": 0},
        {"index": 1, "memory.used": 78369, "memory.total": 97887, "utilization.gpu": 12},
    ]


def test_header_with_units_and_bus_id_and_missing_values():
    text = (
        "index, pci.bus_id, name, memory.used [MiB], utilization.gpu [%]\n"
        "0, 00000000:18:00.0, NVIDIA H100 80GB HBM3, 1 MiB, [N/A]\n"
        "1, 00000000:2A:00.0, NVIDIA H100 80GB HBM3, [Not Supported], 3 %\n"
    )
    rows = parse_query_gpu(text, ["index", "pci.bus_id", "name", "memory.used", "utilization.gpu"])
    assert rows[0]["pci.bus_id"] == "00000000:18:00.0"
    assert rows[0]["utilization.gpu"] is None
    assert rows[1]["memory.used"] is None and rows[1]["utilization.gpu"] == 3
    assert normalize_bus_id(rows[1]["pci.bus_id"]) == "0000:2a:00.0"


def test_alias_in_query_matches_canonical_header():
    text = "name, pci.bus_id\nNVIDIA A40, 00000000:4F:00.0\n"
    rows = parse_query_gpu(text, ["gpu_name", "gpu_bus_id"])
    assert rows == [{"gpu_name": "NVIDIA A40", "gpu_bus_id": "00000000:4F:00.0"}]


def test_header_cells_match_nvidia_smi():
    assert header_cell("memory.used") == "memory.used [MiB]"
    assert header_cell("utilization.gpu") == "utilization.gpu [%]"
    assert header_cell("gpu_bus_id") == "pci.bus_id"


@pytest.mark.parametrize(
    "text",
    [
        "0, 79043 MiB, 97887 MiB\n",
        "index, memory.total [MiB], memory.used [MiB], utilization.gpu [%]\n",
        "0, lots, 97887 MiB, 0 %\n",
    ],
)
def test_malformed_query_output_is_one_line_error(text):
    with pytest.raises(NvsmiParseError) as e:
        parse_query_gpu(text, SEED_FIELDS)
    assert isinstance(e.value, GputopoError)
    assert "\n" not in str(e.value)


def test_empty_output_is_no_gpus():
    assert parse_query_gpu("", SEED_FIELDS) == []


def test_normalize_bus_id():
    assert normalize_bus_id("00000000:01:00.0") == "0000:01:00.0"
    assert normalize_bus_id("00000000:DB:00.0") == "0000:db:00.0"
    with pytest.raises(AddressError):
        normalize_bus_id("GPU-b42dd28e")


def test_q_h100_capture():
    gpus = parse_nvidia_smi_q((REAL / "thamada-H100SXMx8_nvidia-smi-q.txt").read_text())
    assert [g["address"] for g in gpus] == [
        "0000:18:00.0",
        "0000:2a:00.0",
        "0000:3a:00.0",
        "0000:5d:00.0",
        "0000:9a:00.0",
        "0000:ab:00.0",
        "0000:ba:00.0",
        "0000:db:00.0",
    ]
    assert [g["minor"] for g in gpus] == list(range(8))
    first = gpus[0]
    assert first["name"] == "NVIDIA H100 80GB HBM3"
    assert first["bus_id"] == "00000000:18:00.0"
    assert first["uuid"] == "GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1"
    # FB memory, not BAR1 (131072) or the confidential-compute block (0)
    assert (first["memory_total"], first["memory_used"], first["memory_free"]) == (81559, 1, 81106)


def test_q_a40_capture():
    gpus = parse_nvidia_smi_q((REAL / "thamada-A40x10_nvidia-smi-q.txt").read_text())
    assert len(gpus) == 10
    assert [g["minor"] for g in gpus] == list(range(10))
    assert gpus[0]["address"] == "0000:4f:00.0" and gpus[-1]["address"] == "0000:d6:00.0"
    assert all(g["memory_total"] == 46068 and g["name"] == "NVIDIA A40" for g in gpus)
    assert all(normalize_bus_id(g["bus_id"]) == g["address"] for g in gpus)


def test_q_table_summary_agrees_with_q():
    # the table capture of the same machine lists the same bus ids in the same order
    table = (REAL / "thamada-H100SXMx8_nvidia-smi.txt").read_text()
    q = parse_nvidia_smi_q((REAL / "thamada-H100SXMx8_nvidia-smi-q.txt").read_text())
    for g in q:
        assert g["bus_id"] in table


def test_q_minor_na_and_literal():
    text = (
        "GPU 00000000:01:00.0\n"
        "    Product Name                          : NVIDIA RTX PRO 6000 Blackwell Server Edition\n"
        "    Minor Number                          : N/A\n"
        "    PCI\n"
        "        Bus Id                            : 00000000:01:00.0\n"
        "    FB Memory Usage\n"
        "        Total                             : 97887 MiB\n"
        "        Used                              : 79043 MiB\n"
        "    BAR1 Memory Usage\n"
        "        Total                             : 131072 MiB\n"
    )
    (g,) = parse_nvidia_smi_q(text)
    assert g["minor"] is None
    assert g["memory_total"] == 97887 and g["memory_used"] == 79043 and g["memory_free"] is None


def test_q_bad_heading():
    with pytest.raises(NvsmiParseError):
        parse_nvidia_smi_q("GPU nonsense\n")


def test_list_gpus():
    text = (
        "GPU 0: NVIDIA A40 (UUID: GPU-4e65de01-972e-93cf-b077-181a5378972a)\n"
        "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1)\n"
        "  MIG 1g.10gb     Device  0: (UUID: MIG-aaaa)\n"
    )
    assert parse_list_gpus(text) == [
        {"index": 0, "name": "NVIDIA A40", "uuid": "GPU-4e65de01-972e-93cf-b077-181a5378972a"},
        {"index": 1, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1"},
    ]
    with pytest.raises(NvsmiParseError):
        parse_list_gpus("No devices were found\n")
