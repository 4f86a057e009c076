"""GPU checks through their parsers, on the outputs in tests/data/nvidia/; the GPU facts module
on fake sysfs trees; scripts/gpu-check.py end to end with a stand-in nvidia-smi."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from provision.parsers.gpu import (
    GpuExpect,
    all_reduce_finding,
    gpu_findings,
    parse_all_reduce,
    parse_gpu_query,
    parse_nvlink_status,
    parse_remapped_rows,
)

from .conftest import ROOT, collection_module

DATA = ROOT / "tests" / "data" / "nvidia"
H100 = GpuExpect(
    count=8,
    family="h100",
    memory_gib=80,
    driver="550.90.07",
    nvlink_links=18,
    pcie_gen=5,
    pcie_width=16,
    nvswitch=True,
    busbw_gbs=450,
)
# examples/gpu-diskless.yaml's pool (l40s-pcie, Debian's own driver)
L40S = GpuExpect(
    count=4,
    family="l40s",
    memory_gib=48,
    driver=None,
    nvlink_links=0,
    pcie_gen=4,
    pcie_width=16,
    nvswitch=False,
    busbw_gbs=None,
)


def _read(name: str) -> str:
    return (DATA / name).read_text()


def _findings(
    query: str, remapped: str, nvlink: str, want: GpuExpect = H100
) -> dict[str, tuple[bool, str]]:
    found = gpu_findings(
        want,
        parse_gpu_query(_read(query)),
        parse_remapped_rows(_read(remapped)),
        parse_nvlink_status(_read(nvlink)),
    )
    return {check: (ok, evidence) for check, ok, evidence in found}


def test_a_healthy_dgx_h100_passes_every_check() -> None:
    gpus = parse_gpu_query(_read("query-gpu-h100-healthy.csv"))
    assert [g.index for g in gpus] == list(range(8))
    assert gpus[0].name == "NVIDIA H100 80GB HBM3" and gpus[0].memory_mib == 81559
    assert gpus[0].retired_pending is None  # [N/A] on Hopper: row remapping replaced it
    found = _findings(
        "query-gpu-h100-healthy.csv", "remapped-rows-healthy.csv", "nvlink-status-h100.txt"
    )
    assert set(found) == {
        "gpu.count",
        "gpu.driver",
        "gpu.persistence",
        "gpu.memory-errors",
        "gpu.pcie",
        "gpu.nvlink",
    }
    assert all(ok for ok, _ in found.values()), found
    assert found["gpu.nvlink"][1] == "18 links up on every GPU"


def test_a_degraded_node_names_each_fault() -> None:
    found = _findings(
        "query-gpu-h100-degraded.csv",
        "remapped-rows-pending.csv",
        "nvlink-status-h100-two-down.txt",
    )
    assert found["gpu.count"] == (False, "7 of 8 H100 80 GB: NVIDIA H100 80GB HBM3")
    assert found["gpu.persistence"] == (False, "off on GPU [3]")
    assert found["gpu.pcie"] == (False, "GPU 2: gen 5 x8")
    assert found["gpu.memory-errors"] == (
        False,
        "GPU 4: row remap pending (reset the GPU); GPU 5: 2 uncorrectable ECC errors",
    )
    assert found["gpu.nvlink"] == (False, "GPU 6: 16 of 18 up")
    assert found["gpu.driver"][0] is True


def test_driver_pins_by_branch_or_exact_version() -> None:
    query, remapped, nvlink = (
        "query-gpu-h100-healthy.csv",
        "remapped-rows-healthy.csv",
        "nvlink-status-h100.txt",
    )
    for pin, ok in (
        ("550", True),
        ("550.90.07", True),
        ("550.90", True),
        ("535", False),
        ("550.90.1", False),
    ):
        want = GpuExpect(**{**H100.__dict__, "driver": pin})
        assert _findings(query, remapped, nvlink, want)["gpu.driver"][0] is ok, pin


def test_a_different_gpu_model_fails_the_count() -> None:
    want = GpuExpect(**{**H100.__dict__, "family": "h200", "memory_gib": 141})
    found = _findings(
        "query-gpu-h100-healthy.csv", "remapped-rows-healthy.csv", "nvlink-status-h100.txt", want
    )
    assert found["gpu.count"][0] is False


def test_a_recorded_h200_passes_what_a_one_gpu_vm_can() -> None:
    """Recorded on a one-GPU H200 virtual machine (driver 580, open kernel module): every check
    a single PCIe-attached GPU can pass passes; its NVLink links are down and say so."""
    gpus = parse_gpu_query(_read("query-gpu-h200-recorded.csv"))
    assert [(g.index, g.name, g.memory_mib) for g in gpus] == [(0, "NVIDIA H200", 143771)]
    one_gpu = {"count": 1, "family": "h200", "memory_gib": 141, "driver": "580"}
    want = GpuExpect(**{**H100.__dict__, **one_gpu, "nvswitch": False, "busbw_gbs": None})
    found = _findings(
        "query-gpu-h200-recorded.csv",
        "remapped-rows-h200-recorded.csv",
        "nvlink-status-h200-vm-recorded.txt",
        want,
    )
    assert found["gpu.count"] == (True, "1 of 1 H200 141 GB: NVIDIA H200")
    for check in ("gpu.driver", "gpu.persistence", "gpu.memory-errors", "gpu.pcie"):
        assert found[check][0] is True, (check, found[check])
    # nvidia-smi prints nothing for a GPU without NVLink peers: no links up, never a pass
    assert _read("nvlink-status-h200-vm-recorded.txt") == ""
    assert found["gpu.nvlink"] == (False, "GPU 0: 0 of 18 up")


def test_no_driver_in_a_container_is_no_gpu() -> None:
    text = _read("no-driver-container.txt")
    assert parse_gpu_query(text) == []
    found = gpu_findings(H100, [], {}, {})
    assert [(c, ok) for c, ok, _ in found if ok] == [("gpu.memory-errors", True)]


def test_all_reduce_newer_layout_meets_the_h100_threshold() -> None:
    result = parse_all_reduce(_read("all-reduce-h100-8gpu.txt"))
    assert result is not None
    assert (result.sizes, result.largest_bytes, result.wrong) == (4, 8 * 2**30, 0)
    assert result.busbw_gbs == pytest.approx(479.11)
    assert result.avg_busbw_gbs == pytest.approx(468.298)
    assert all_reduce_finding(H100, result) == (
        "nccl.all_reduce",
        True,
        "busbw 479.1 GB/s at 8 GiB, threshold 450",
    )


def test_all_reduce_older_layout_below_the_threshold_fails() -> None:
    result = parse_all_reduce(_read("all-reduce-h100-8gpu-slow.txt"))
    assert result is not None and result.busbw_gbs == pytest.approx(189.4)
    check, ok, evidence = all_reduce_finding(H100, result)
    assert (check, ok) == ("nccl.all_reduce", False)
    assert evidence == "busbw 189.4 GB/s at 8 GiB, threshold 450"


def test_all_reduce_wrong_values_fail_whatever_the_speed() -> None:
    text = _read("all-reduce-h100-8gpu.txt").replace("   0\n# Out", "   3\n# Out")
    result = parse_all_reduce(text)
    assert result is not None and result.wrong == 3
    assert all_reduce_finding(H100, result)[1] is False
    assert all_reduce_finding(H100, parse_all_reduce("# nothing ran\n"))[1] is False


# --- the module the roles call first ---------------------------------------------------------


def _facts_module():
    return collection_module("nvidia_gpu_facts")


def _pci(root: Path, slot: str, vendor: str, pci_class: str) -> None:
    dev = root / "sys" / "bus" / "pci" / "devices" / slot
    dev.mkdir(parents=True)
    (dev / "vendor").write_text(vendor + "\n")
    (dev / "class").write_text(pci_class + "\n")


def test_gpu_facts_count_gpus_and_nvswitches(tmp_path: Path) -> None:
    for i in range(8):
        _pci(tmp_path, f"0000:{0x18 + i:02x}:00.0", "0x10de", "0x030200")
    for i in range(4):
        _pci(tmp_path, f"0000:{0xA0 + i:02x}:00.0", "0x10de", "0x068000")
    _pci(tmp_path, "0000:00:1f.0", "0x8086", "0x060100")  # not NVIDIA
    _pci(tmp_path, "0000:01:00.0", "0x10de", "0x040300")  # an NVIDIA audio function
    version = tmp_path / "proc" / "driver" / "nvidia" / "version"
    version.parent.mkdir(parents=True)
    version.write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.90.07  "
        "Release Build  (dvs-builder@U16-I3-B03-4-3)  Fri May 31 09:30:47 UTC 2024\n"
    )
    facts = _facts_module().detect(str(tmp_path))
    assert facts == {
        "nvidia_gpu_count": 8,
        "nvidia_nvswitch_count": 4,
        "nvidia_in_container": False,
        "nvidia_hardware": True,
        "nvidia_loaded_driver": "550.90.07",
        "nvidia_summary": "8 NVIDIA GPU(s), 4 NVSwitch(es)",
    }


def test_gpu_facts_read_a_recorded_580_open_module_version(tmp_path: Path) -> None:
    _pci(tmp_path, "0000:00:06.0", "0x10de", "0x030200")  # as the H200 VM's sysfs has it
    version = tmp_path / "proc" / "driver" / "nvidia" / "version"
    version.parent.mkdir(parents=True)
    shutil.copy(DATA / "proc-driver-version-580-open-recorded.txt", version)
    facts = _facts_module().detect(str(tmp_path))
    assert facts["nvidia_loaded_driver"] == "580.159.04"
    assert facts["nvidia_gpu_count"] == 1 and facts["nvidia_hardware"] is True


def test_gpu_facts_in_a_container_never_touch_the_kernel(tmp_path: Path) -> None:
    _pci(tmp_path, "0000:18:00.0", "0x10de", "0x030200")  # the host's GPU shows through sysfs
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".containerenv").write_text("")
    facts = _facts_module().detect(str(tmp_path))
    assert facts["nvidia_gpu_count"] == 1 and facts["nvidia_in_container"] is True
    assert facts["nvidia_hardware"] is False
    assert facts["nvidia_summary"].startswith("container: userspace only")


def test_gpu_facts_on_a_machine_without_nvidia_find_no_gpu(tmp_path: Path) -> None:
    _pci(tmp_path, "0000:00:1f.0", "0x8086", "0x060100")
    _pci(tmp_path, "0000:03:00.0", "0x1a03", "0x030000")  # a BMC's VGA: a display, not NVIDIA
    facts = _facts_module().detect(str(tmp_path))
    assert facts["nvidia_gpu_count"] == 0 and facts["nvidia_hardware"] is False
    assert facts["nvidia_loaded_driver"] == ""
    assert facts["nvidia_summary"].startswith("no NVIDIA GPU")


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs a GPU host (nvidia-smi)")
def test_gpu_facts_on_this_gpu_host_count_what_nvidia_smi_lists() -> None:
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True)
    gpus = [line for line in listed.stdout.splitlines() if line.startswith("GPU ")]
    facts = _facts_module().detect("/")
    assert facts["nvidia_gpu_count"] == len(gpus) > 0
    assert facts["nvidia_loaded_driver"]  # the kernel module nvidia-smi talks to is loaded


# --- the one script for a GPU host -------------------------------------------------------------

_FAKE_SMI = """#!/bin/sh
case "$*" in
  *--query-gpu=*) cat "$DATA/query-gpu-h100-$STATE.csv" ;;
  *--query-remapped-rows=*) cat "$DATA/remapped-rows-healthy.csv" ;;
  "nvlink --status") cat "$DATA/nvlink-status-h100.txt" ;;
  *) echo "fake nvidia-smi: $*" ;;
esac
"""


@pytest.mark.parametrize(("state", "rc"), [("healthy", 0), ("degraded", 1)])
def test_gpu_check_script_on_a_stand_in_host(tmp_path: Path, state: str, rc: int) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(_FAKE_SMI)
    smi.chmod(0o755)
    systemctl = bin_dir / "systemctl"
    systemctl.write_text("#!/bin/sh\necho active\n")
    systemctl.chmod(0o755)
    record = tmp_path / "record"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "DATA": str(DATA),
        "STATE": state,
    }
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "gpu-check.py"),
            "--profile",
            "dgx-h100",
            "--driver",
            "550",
            "--all-reduce",
            str(tmp_path / "absent"),
            "--record",
            str(record),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == rc, done.stdout + done.stderr
    assert "ok   gpu.fabricmanager: active" in done.stdout
    assert "skip nccl.all_reduce" in done.stdout
    if state == "healthy":
        assert done.stdout.count("ok   ") == 7
    else:
        assert "FAIL gpu.count: 7 of 8 H100 80 GB" in done.stdout
    assert (record / "query-gpu.csv").read_text() == _read(f"query-gpu-h100-{state}.csv")


# --- the commands both runners use, and what they add up to ----------------------------------

_OUTPUTS = {
    "query-gpu.csv": "query-gpu-h100-healthy.csv",
    "remapped-rows.csv": "remapped-rows-healthy.csv",
    "nvlink-status.txt": "nvlink-status-h100.txt",
    "all-reduce.txt": "all-reduce-h100-8gpu.txt",
}


def test_commands_follow_the_profile() -> None:
    from provision.parsers.gpu import gpu_commands

    commands = gpu_commands(H100)
    assert list(commands) == [
        "query-gpu.csv",
        "remapped-rows.csv",
        "nvlink-status.txt",
        "fabricmanager.txt",
        "all-reduce.txt",
    ]
    assert commands["all-reduce.txt"].endswith("all_reduce_perf -b 1G -e 8G -f 2 -g 8")
    pcie_only = GpuExpect(**{**H100.__dict__, "nvlink_links": 0, "nvswitch": False})
    assert list(gpu_commands(pcie_only, None)) == ["query-gpu.csv", "remapped-rows.csv"]


def test_findings_from_command_outputs() -> None:
    from provision.parsers.gpu import findings_from

    outputs = {name: (0, _read(file)) for name, file in _OUTPUTS.items()}
    outputs["fabricmanager.txt"] = (3, "inactive\n")
    found = {check: (ok, ev) for check, ok, ev in findings_from(H100, outputs)}
    assert found["gpu.fabricmanager"] == (False, "inactive")
    assert found["nccl.all_reduce"][0] is True
    assert all(ok for check, (ok, _) in found.items() if check != "gpu.fabricmanager")

    outputs["all-reduce.txt"] = (127, "sh: 1: /opt/nccl-tests/build/all_reduce_perf: not found\n")
    found = {check: (ok, ev) for check, ok, ev in findings_from(H100, outputs)}
    assert found["nccl.all_reduce"] == (
        False,
        "did not run (rc 127): sh: 1: /opt/nccl-tests/build/all_reduce_perf: not found",
    )

    no_driver = {"query-gpu.csv": (255, _read("no-driver-container.txt"))}
    assert findings_from(H100, no_driver) == [
        ("gpu.count", False, "nvidia-smi failed: Failed to initialize NVML: Unknown Error")
    ]


def test_verify_runs_the_gpu_checks_over_a_session() -> None:
    from provision.cluster import Cluster
    from provision.parsers.gpu import gpu_commands
    from provision.spec import load_spec
    from provision.state import State
    from provision.verify import VerifyContext
    from provision.verify.gpu import check_gpus
    from provision.verify.remote import Output

    cluster = Cluster(load_spec(ROOT / "examples" / "dgx-superpod.yaml"))
    node = next(n for n in cluster.nodes if n.name == "gpu001")
    by_command = {cmd: name for name, cmd in gpu_commands(H100).items()}
    ran = []

    class Session:  # answers each command with its output in tests/data/nvidia
        def run(self, command: str, sudo: bool = False, timeout: float = 60.0) -> Output:
            ran.append((by_command[command], timeout))
            name = by_command[command]
            if name == "fabricmanager.txt":
                return Output(0, "active\n", "")
            return Output(0, _read(_OUTPUTS[name]), "")

    ctx = VerifyContext(cluster, State(Path("/nonexistent"), "superpod"), "")
    results = check_gpus(ctx, node, Session())  # type: ignore[arg-type]
    assert [(r.check, r.passed) for r in results] == [
        ("gpu.count", True),
        ("gpu.driver", True),
        ("gpu.persistence", True),
        ("gpu.memory-errors", True),
        ("gpu.pcie", True),
        ("gpu.nvlink", True),
        ("gpu.fabricmanager", True),
        ("nccl.all_reduce", True),
    ]
    assert {r.target for r in results} == {"gpu001"}
    assert ran[-1] == ("all-reduce.txt", 600.0)
    # the same node running jobs: read only, NCCL not run (it would share the GPUs with a job)
    ran.clear()
    busy = VerifyContext(cluster, ctx.state, "", quiet=frozenset({"gpu002"}))
    results = check_gpus(busy, node, Session())  # type: ignore[arg-type]
    assert "all-reduce.txt" not in [name for name, _ in ran]
    assert (results[-1].check, results[-1].passed) == ("nccl.all_reduce", True)
    assert results[-1].evidence.startswith("not run: the node runs jobs")
    assert [r.check for r in results[:-1]] == [
        "gpu.count", "gpu.driver", "gpu.persistence", "gpu.memory-errors", "gpu.pcie",
        "gpu.nvlink", "gpu.fabricmanager",
    ]  # fmt: skip


def test_why_nvidia_smi_cannot_reach_the_gpus_is_said_once() -> None:
    """nvidia-smi failing says nothing of why: the driver's state (the PCI bus, the module for
    the running kernel, whether it is loaded) makes one line of it, never a failure per check."""
    from provision.parsers.gpu import (
        DriverState,
        driver_finding,
        findings_from,
        parse_driver_state,
    )

    smi = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    # recorded in a lab container: no GPU, no module for this machine's kernel
    here = parse_driver_state(_read("driver-state-container-recorded.txt"))
    assert here == DriverState("6.18.44-fc-v1300", 0, "", "", "", False)
    assert driver_finding(H100, smi, here) == (
        "gpu.count",
        False,
        "no NVIDIA GPU on the PCI bus (the profile promises 8); no NVIDIA kernel module is "
        "installed for the running kernel (6.18.44-fc-v1300)",
    )
    # recorded on a QEMU machine booted from a GPU pool's image (examples/gpu-diskless.yaml's,
    # Debian's own driver): DKMS built the module for the kernel it booted, no GPU to load it for
    booted = parse_driver_state(_read("driver-state-qemu-no-gpu-recorded.txt"))
    assert booted == DriverState(
        "6.1.0-57-amd64", 0, "nvidia-current", "535.309.01", "6.1.0-57-amd64", False
    )
    failed = {"query-gpu.csv": (9, _read("query-gpu-qemu-no-gpu-recorded.txt"))}
    failed["driver-state.txt"] = (0, _read("driver-state-qemu-no-gpu-recorded.txt"))
    assert findings_from(L40S, failed) == [
        (
            "gpu.count",
            False,
            "no NVIDIA GPU on the PCI bus (the profile promises 4): the driver's module "
            "(nvidia-current 535.309.01) is built for this kernel (6.1.0-57-amd64), and cannot "
            "load without one",
        )
    ]
    # GPUs there, the module built by DKMS before a kernel upgrade whose headers were missing
    stale = parse_driver_state(
        "kernel 6.8.0-49-generic\npci 8\nmodule nvidia 550.90.07 6.8.0-45-generic\n"
    )
    assert driver_finding(H100, smi, stale) == (
        "gpu.count",
        False,
        f"nvidia-smi failed: {smi}; the driver's module (nvidia 550.90.07) is built for "
        "6.8.0-45-generic, not the running 6.8.0-49-generic: DKMS builds it for a kernel whose "
        "headers are installed",
    )
    # the right module, not loaded
    idle = parse_driver_state(
        "kernel 6.8.0-49-generic\npci 8\nmodule nvidia 550.90.07 6.8.0-49-generic\n"
    )
    assert driver_finding(H100, smi, idle)[2].endswith(
        "the driver's module (nvidia 550.90.07) is built for this kernel (6.8.0-49-generic), "
        "but not loaded (modprobe nvidia)"
    )
    # not the command's output: nvidia-smi's own line alone
    assert parse_driver_state("sh: 1: modinfo: not found\n") is None
    assert driver_finding(H100, smi, None) == ("gpu.count", False, f"nvidia-smi failed: {smi}")


def test_verify_asks_the_driver_state_once_nvidia_smi_failed() -> None:
    from provision.cluster import Cluster
    from provision.parsers.gpu import DRIVER_STATE_COMMAND, QUERY_GPU, gpu_commands
    from provision.spec import load_spec
    from provision.state import State
    from provision.verify import VerifyContext
    from provision.verify.gpu import check_gpus
    from provision.verify.remote import Output

    cluster = Cluster(load_spec(ROOT / "examples" / "dgx-superpod.yaml"))
    node = next(n for n in cluster.nodes if n.name == "gpu001")
    query = gpu_commands(H100)[QUERY_GPU]
    ran = []

    class Session:
        def run(self, command: str, sudo: bool = False, timeout: float = 60.0) -> Output:
            ran.append(command)
            if command == query:
                return Output(9, "", "NVIDIA-SMI has failed because it couldn't communicate\n")
            assert command == DRIVER_STATE_COMMAND, command
            return Output(0, _read("driver-state-container-recorded.txt"), "")

    ctx = VerifyContext(cluster, State(Path("/nonexistent"), "superpod"), "")
    results = check_gpus(ctx, node, Session())  # type: ignore[arg-type]
    assert ran == [query, DRIVER_STATE_COMMAND]
    assert [(r.check, r.passed) for r in results] == [("gpu.count", False)]
    assert results[0].evidence.startswith("no NVIDIA GPU on the PCI bus (the profile promises 8)")


def test_the_driver_state_command_runs_in_a_posix_shell() -> None:
    """The real sh runs it here (no NVIDIA device, no module): its lines parse."""
    from provision.parsers.gpu import DRIVER_STATE_COMMAND, parse_driver_state

    done = subprocess.run(["sh", "-c", DRIVER_STATE_COMMAND], capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    state = parse_driver_state(done.stdout)
    assert state is not None and state.kernel == os.uname().release
    assert state.pci_gpus is not None and not state.loaded


# --- NCCL across two nodes: what catches NCCL fallen back to TCP sockets --------------------


def test_the_network_threshold_is_half_the_line_rate_of_what_nccl_drives() -> None:
    from provision.cluster import Cluster
    from provision.spec import load_spec
    from provision.verify.gpu import network_threshold

    def pools(spec: str) -> dict[str, tuple[float | None, str]]:
        cluster = Cluster(load_spec(ROOT / "examples" / spec))
        return {v.name: network_threshold(cluster, v) for v in cluster.pools if v.profile.gpu}

    assert pools("dgx-8.yaml") == {
        "dgx": (200.0, "half the line rate of 8 x 400 Gb/s ConnectX-7"),
    }
    hybrid = pools("hybrid-cloud.yaml")
    assert hybrid["awsh100"] == (200.0, "half the line rate of 32 x 100 Gb/s EFA")
    assert hybrid["azh100"] == (200.0, "half the line rate of 8 x 400 Gb/s ConnectX-7")
    # GCP's A3 High runs NCCL over TCP sockets (no TCPX): measured, no threshold
    assert hybrid["gcph100"] == (None, "TCP sockets between the nodes: no threshold")
    assert hybrid["onprem"] == (None, "TCP sockets between the nodes: no threshold")


def test_nccl_across_two_held_nodes_through_slurm() -> None:
    from provision.cluster import Cluster
    from provision.spec import load_spec
    from provision.state import State
    from provision.verify import VerifyContext, slurm
    from provision.verify.remote import Output

    class Head:
        def __init__(self, answer: str) -> None:
            self.answer, self.asked = answer, []  # type: tuple[str, list[str]]

        def run(self, command: str, sudo: bool = False, timeout: float = 60.0) -> Output:
            self.asked.append(command)
            return Output(0, (DATA / self.answer).read_text(), "")

    cluster = Cluster(load_spec(ROOT / "examples" / "dgx-8.yaml"))
    ctx = VerifyContext(cluster, State(Path("/nonexistent"), "dgx8"), "")
    hold = slurm.Hold({}, True, reservation="provision-verify")
    names = [f"dgx0{i}" for i in range(1, 5)]
    head = Head("all-reduce-h100-8gpu.txt")
    (good,) = slurm._network_all_reduce(ctx, head, hold, "dgx", names)  # type: ignore[arg-type]
    assert head.asked == [
        "timeout 900 srun --reservation=provision-verify -p dgx -N2 -w dgx01,dgx02 "
        "--ntasks-per-node=8 --gpus-per-node=8 --mpi=pmix --time=15 "
        "/opt/nccl-tests/build/all_reduce_perf -b 1G -e 8G -f 2 -g 1"
    ]
    assert good.passed and good.target == "dgx01+dgx02"
    assert "threshold 200 (half the line rate of 8 x 400 Gb/s ConnectX-7)" in good.evidence
    (tcp,) = slurm._network_all_reduce(  # type: ignore[arg-type]
        ctx, Head("all-reduce-2x8-h100-sockets.txt"), hold, "dgx", names
    )
    assert not tcp.passed and tcp.evidence.startswith("busbw 11.5 GB/s at 8 GiB, threshold 200")
    (alone,) = slurm._network_all_reduce(ctx, head, hold, "dgx", ["dgx05"])  # type: ignore[arg-type]
    assert alone.passed and alone.evidence.startswith("not run: fewer than two")
    assert slurm._network_all_reduce(ctx, head, hold, "head", ["head01", "x"]) == []  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("reported_mib", "profile_gib", "same"),
    [
        (46068, 48, True),  # L40S "48GB" with ECC on, as nvidia-smi reports it
        (23028, 24, True),  # A10 / A10G "24GB"
        (15360, 16, True),  # T4 "16GB"
        (81559, 80, True),  # H100 SXM 80GB (tests/data/nvidia/query-gpu-h100-healthy.csv)
        (143771, 141, True),  # H200 (recorded, tests/data/nvidia/query-gpu-h200-recorded.csv)
        (40960, 80, False),  # an A100 40GB where the profile says 80
        (95830, 80, False),  # an H100 NVL (94 GB) where the profile says H100 80GB
        (None, 80, False),
    ],
)
def test_memory_allows_what_the_gpu_keeps_back(
    reported_mib: int | None, profile_gib: int, same: bool
) -> None:
    from provision.parsers.gpu import memory_matches

    assert memory_matches(reported_mib, profile_gib) is same


def test_mig_pools_skip_nvlink_and_the_all_reduces() -> None:
    """Under MIG a process drives one instance and no instance uses NVLink: verify neither
    counts links nor runs an all_reduce there (on the node or across two), and says so."""
    from provision.cluster import Cluster
    from provision.parsers.gpu import findings_from, gpu_commands
    from provision.render.health import gpu_expect
    from provision.spec import load_spec
    from provision.state import State
    from provision.verify import VerifyContext, slurm

    cluster = Cluster(load_spec(ROOT / "examples" / "dgx-superpod.yaml"))
    migs = [v for v in cluster.pools if v.pool.mig]
    assert migs, "the example has a MIG pool"
    want = gpu_expect(migs[0], None)
    assert want is not None and want.mig and want.nvlink_links
    assert list(gpu_commands(want)) == ["query-gpu.csv", "remapped-rows.csv", "fabricmanager.txt"]
    outputs = {
        "query-gpu.csv": (0, _read("query-gpu-h100-healthy.csv")),
        "remapped-rows.csv": (0, _read("remapped-rows-healthy.csv")),
    }
    want = GpuExpect(**{**H100.__dict__, "mig": True})
    found = {c: (ok, ev) for c, ok, ev in findings_from(want, outputs)}
    assert found["gpu.nvlink"] == (True, "not checked: MIG instances use no NVLink")
    assert "nccl.all_reduce" not in found
    ctx = VerifyContext(cluster, State(Path("/nonexistent"), "x"), "")
    hold = slurm.Hold({}, True, reservation="provision-verify")
    names = [n.name for n in migs[0].nodes][:2]
    (skipped,) = slurm._network_all_reduce(ctx, None, hold, migs[0].name, names)  # type: ignore[arg-type]
    assert skipped.passed and "MIG instances" in skipped.evidence
    plain = GpuExpect(**{**H100.__dict__, "mig": False})
    assert "all-reduce.txt" in gpu_commands(plain) and "nvlink-status.txt" in gpu_commands(plain)
