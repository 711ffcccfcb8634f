"""PCIe capability values a simulated function shows: its device/port type and link speeds."""

# PCIe capability device/port types (PCIe base spec, "Device/Port Type").
EP, LEGACY_EP, ROOT_PORT, UPSTREAM, DOWNSTREAM, RCIEP = 0, 1, 4, 5, 6, 9

LINK_SPEEDS = {
    1: "2.5 GT/s PCIe",
    2: "5.0 GT/s PCIe",
    3: "8.0 GT/s PCIe",
    4: "16.0 GT/s PCIe",
    5: "32.0 GT/s PCIe",
    6: "64.0 GT/s PCIe",
}
