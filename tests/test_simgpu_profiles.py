"""simgpu's GPUs are named profiles of real boards (simgpu/profiles.c): what a
board is called, its memory, SMs, compute capability, PCI identity and slots,
what its context costs, what its driver keeps for itself and its process-
utilisation sample buffer, the same through NVML and through the driver. The
H200's are the figures measured on one (docs/facts.md §1); SIMGPU_PROFILE picks a
board, and SIMGPU_MEMORY, SIMGPU_SMS, SIMGPU_CONTEXT_OVERHEAD and
SIMGPU_RESERVED override its figures."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import TESTS, run

CLIENTS = TESTS / "clients"
MiB = 1 << 20
PINNED = ("SIMGPU_MEMORY", "SIMGPU_CONTEXT_OVERHEAD", "SIMGPU_RESERVED")

# key: name, memory, SMs, compute capability, PCI device id, context, reserve, sample buffer, first two slots
BOARDS = {
    "h100-80gb": ("NVIDIA H100 80GB HBM3", 81559 * MiB, 132, [9, 0], 0x233010DE, 500 * MiB, 1024 * MiB, 100,
                  ["0000:18:00.0", "0000:2A:00.0"]),
    "h200-141gb": ("NVIDIA H200", 143771 * MiB, 132, [9, 0], 0x233510DE, 518 * MiB, 644939776, 72,
                   ["0000:18:00.0", "0000:2A:00.0"]),
    "a100-40gb": ("NVIDIA A100-SXM4-40GB", 40536 * MiB, 108, [8, 0], 0x20B010DE, 420 * MiB, 583 * MiB, 100,
                  ["0000:07:00.0", "0000:0F:00.0"]),
    "a100-80gb": ("NVIDIA A100-SXM4-80GB", 81920 * MiB, 108, [8, 0], 0x20B210DE, 420 * MiB, 583 * MiB, 100,
                  ["0000:07:00.0", "0000:0F:00.0"]),
    "l4": ("NVIDIA L4", 23034 * MiB, 58, [8, 9], 0x27B810DE, 300 * MiB, 400 * MiB, 100,
           ["0000:00:03.0", "0000:00:04.0"]),
}


@pytest.fixture
def bare_env(sim_env):
    """sim_env without the suite's pins: the board's own figures."""
    return {k: v for k, v in sim_env.items() if k not in PINNED}


def board(env, **extra) -> dict:
    return json.loads(run([sys.executable, CLIENTS / "board.py"], dict(env, **extra), timeout=60).stdout)


def check_board(seen, key: str, devices: int = 2) -> None:
    name, memory, sms, cc, pci_id, context, reserved, samples, slots = BOARDS[key]
    nvml, cuda = seen["nvml"], seen["cuda"]
    assert len(nvml) == len(cuda) == devices
    for i, (n, c) in enumerate(zip(nvml, cuda)):
        assert n["name"] == c["name"] == name
        assert c["total"] == n["v1"]["total"] == n["v2"]["total"] == memory
        assert c["sms"] == sms and c["cc"] == n["cc"] == cc
        assert n["pci"][3] == pci_id
        assert c["bus_id"] == slots[i] and n["bus_id"] == "0000" + slots[i]
        assert c["pci"] == n["pci"][:3] and n["index_by_bus_id"] == i
        assert n["process_samples"] == samples
        # The driver's reserve, as the H200's driver counted it; no context is held here.
        assert n["v1"] == {"total": memory, "free": memory - reserved, "used": reserved}
        assert n["v2"] == {"total": memory, "reserved": reserved, "free": memory - reserved, "used": 0}
        # A fresh context costs the board's context, and the reserve is never free.
        assert c["meminfo"] == [memory - reserved - context, memory]


@pytest.mark.parametrize("key", BOARDS)
def test_each_profile_is_one_board_through_nvml_and_the_driver(bare_env, key):
    check_board(board(bare_env, SIMGPU_PROFILE=key, SIMGPU_DEVICES="2"), key)


def test_the_default_board_is_the_h200_as_measured(bare_env):
    check_board(board(bare_env, SIMGPU_DEVICES="2"), "h200-141gb")


def test_a_profiles_figures_can_be_overridden(bare_env):
    seen = board(bare_env, SIMGPU_PROFILE="a100-80gb", SIMGPU_MEMORY="10GiB", SIMGPU_SMS="100",
                 SIMGPU_CONTEXT_OVERHEAD="64MiB", SIMGPU_RESERVED="100MiB")
    [n], [c] = seen["nvml"], seen["cuda"]
    assert n["name"] == c["name"] == "NVIDIA A100-SXM4-80GB"
    assert c["sms"] == 100
    assert n["v2"] == {"total": 10240 * MiB, "reserved": 100 * MiB, "free": 10140 * MiB, "used": 0}
    assert c["meminfo"] == [(10240 - 100 - 64) * MiB, 10240 * MiB]


def test_boards_past_eight_sit_in_the_next_pci_domain(bare_env):
    seen = board(bare_env, SIMGPU_PROFILE="a100-40gb", SIMGPU_DEVICES="10")
    assert [c["bus_id"] for c in seen["cuda"]][7:] == ["0000:BD:00.0", "0001:07:00.0", "0001:0F:00.0"]
    assert [n["bus_id"] for n in seen["nvml"]][8:] == ["00000001:07:00.0", "00000001:0F:00.0"]
    assert [n["index_by_bus_id"] for n in seen["nvml"]] == list(range(10))


@pytest.mark.parametrize("extra, names", [
    ({"SIMGPU_PROFILE": "h300"}, ["SIMGPU_PROFILE=h300", "h100-80gb, h200-141gb, a100-40gb, a100-80gb, l4"]),
    ({"SIMGPU_PROFILE": "H200-141GB"}, ["SIMGPU_PROFILE=H200-141GB"]),
    ({"SIMGPU_MEMORY": "512MiB"}, ["SIMGPU_MEMORY=512MiB", "h200-141gb", "SIMGPU_RESERVED"]),
    ({"SIMGPU_MEMORY": "1GiB", "SIMGPU_RESERVED": "1GiB"}, ["SIMGPU_RESERVED=1GiB"]),
])
def test_a_bad_board_fails_nvml_init_with_one_line(bare_env, extra, names):
    code = ("import pynvml\ntry:\n    pynvml.nvmlInit()\n    print('initialised')\n"
            "except pynvml.NVMLError as e:\n    print(type(e).__name__)")
    result = run([sys.executable, "-c", code], bare_env | extra, timeout=60)
    assert result.stdout.strip() == "NVMLError_Unknown"
    [line] = result.stderr.splitlines()
    assert all(name in line for name in names), line
