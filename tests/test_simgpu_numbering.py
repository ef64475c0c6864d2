"""simgpu numbers devices as the real libcuda does: CUDA_DEVICE_ORDER picks the
order (the fastest first by default, else by PCI bus id), CUDA_VISIBLE_DEVICES
picks and reorders the devices by index or UUID, and NVML ignores both.  The
rules and their sources are in simgpu/devices.c."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import run
from containers import CLIENTS

# Four devices whose speeds differ: machine 0 and 3 are H100 PCIe (114 SMs),
# 1 and 2 H100 SXM (132).  Fastest first: 1, 2, 0, 3; by bus: 0, 1, 2, 3.
MIXED = {"SIMGPU_DEVICES": "4", "SIMGPU_SMS": "114,132,132,114"}


def numbering(env, *args, **extra) -> dict:
    return json.loads(run([sys.executable, CLIENTS / "numbering.py", *args], dict(env, **extra)).stdout)


def machine_order(seen) -> list[int]:
    """CUDA's ordinals as indices of the machine (NVML's numbering)."""
    by_uuid = {uuid: i for i, uuid in enumerate(seen["nvml"])}
    return [by_uuid[d["uuid"]] for d in seen["cuda"]]


def test_default_order_is_fastest_first_and_pci_bus_id_is_the_machines(sim_env):
    fastest = numbering(sim_env | MIXED)
    by_bus = numbering(sim_env | MIXED, CUDA_DEVICE_ORDER="PCI_BUS_ID")
    assert machine_order(fastest) == [1, 2, 0, 3]
    assert [d["sms"] for d in fastest["cuda"]] == [132, 132, 114, 114]
    assert machine_order(by_bus) == [0, 1, 2, 3]
    # The default board's slots, those of a DGX H200 (simgpu/profiles.c).
    assert [d["bus"] for d in by_bus["cuda"]] == ["0000:18:00.0", "0000:2A:00.0", "0000:3A:00.0", "0000:5D:00.0"]
    # NVML keeps the machine's order whatever CUDA does.
    assert fastest["nvml"] == by_bus["nvml"]
    # Identical devices: both orders are the bus order.
    same = numbering(sim_env | {"SIMGPU_DEVICES": "3", "SIMGPU_STATE": sim_env["SIMGPU_STATE"] + "3"})
    assert machine_order(same) == [0, 1, 2]


@pytest.mark.parametrize("order, visible, expected", [
    ("PCI_BUS_ID", "2,0", [2, 0]),
    ("FASTEST_FIRST", "2,0", [0, 1]),     # indices count in CUDA's order: 2 is machine 0
    ("PCI_BUS_ID", "1", [1]),
    ("PCI_BUS_ID", "3, 1", [3, 1]),       # blanks around an index, as strtoul skips them
    ("PCI_BUS_ID", "1gpu,0", [1, 0]),     # strtoul reads the leading digits
    ("PCI_BUS_ID", "1,7,0", [1]),         # the list ends at the first index that names no device
    ("PCI_BUS_ID", "0,2,-1,1", [0, 2]),   # the Programming Guide's own example
    ("PCI_BUS_ID", "2,GPU-,0", [2]),      # a UUID in a list of indices ends it
])
def test_visible_devices_by_index(sim_env, order, visible, expected):
    seen = numbering(sim_env | MIXED, CUDA_DEVICE_ORDER=order, CUDA_VISIBLE_DEVICES=visible)
    assert machine_order(seen) == expected
    assert len(seen["nvml"]) == 4


def test_visible_devices_by_uuid_and_unique_prefix(sim_env):
    uuids = numbering(sim_env | MIXED)["nvml"]
    for visible, expected in [
        (f"{uuids[3]},{uuids[1]}", [3, 1]),
        (f"{uuids[2][:12]},{uuids[0][:8]}", [2, 0]),
        (f"{uuids[2]},1", [2]),                   # an index in a list of UUIDs ends it
        (f"{uuids[2]},GPU-,{uuids[0]}", [2]),     # "GPU-" names every device: ambiguous, the end
        (f"{uuids[1]},GPU-ffffffff", [1]),        # no such device: the end
    ]:
        seen = numbering(sim_env | MIXED, CUDA_VISIBLE_DEVICES=visible)
        assert machine_order(seen) == expected, visible


@pytest.mark.parametrize("visible", ["", "0,0", "2,1,2", "-1", "MIG-GPU-1/0/0", "GPU-", "x"])
def test_no_device_left_makes_cuinit_fail_and_nvml_still_answers(sim_env, visible):
    """"" hides every device (Programming Guide); a device listed twice empties
    the list (as PyTorch mirrors the driver); a MIG UUID that names no
    instance (no GPU here is in MIG mode) leaves none."""
    seen = numbering(sim_env | MIXED, CUDA_VISIBLE_DEVICES=visible)
    assert seen["init"] == "CUDA_ERROR_NO_DEVICE"
    assert len(seen["nvml"]) == 4


def test_a_repeated_uuid_empties_the_list(sim_env):
    uuids = numbering(sim_env | MIXED)["nvml"]
    seen = numbering(sim_env | MIXED, CUDA_VISIBLE_DEVICES=f"{uuids[1]},{uuids[1][:10]}")
    assert seen["init"] == "CUDA_ERROR_NO_DEVICE"


def test_peer_access_between_two_visible_devices(sim_env):
    seen = numbering(sim_env | MIXED, "--peers", CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES="2,0")
    peers = seen["peers"]
    assert peers["can_access"] == [1, 0]          # a device is never its own peer
    assert peers["ctx_device"] == [1, 0]          # CUDA's ordinals, not the machine's 0 and 2
    assert peers["enable"] == ["CUDA_SUCCESS", "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
                               "CUDA_ERROR_INVALID_CONTEXT", "CUDA_ERROR_INVALID_VALUE"]
    assert peers["disable"] == ["CUDA_SUCCESS", "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED"]


def test_a_bad_sm_list_is_one_line_naming_the_variable(sim_env):
    seen = run([sys.executable, CLIENTS / "numbering.py"], sim_env | {"SIMGPU_DEVICES": "3", "SIMGPU_SMS": "132,114"},
               check=False)
    assert seen.returncode != 0
    assert "SIMGPU_SMS=132,114: expected streaming multiprocessors per device" in seen.stderr
