"""Pure functions over nvidia-smi and nccl-tests output, and the GPU findings drawn from them.

Standard library only: scripts/gpu-check.py loads this file on a GPU host that has nothing
but python3. Tested on the recordings in tests/data/nvidia/.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The fields verify asks nvidia-smi for, in this order (--format=csv,noheader,nounits).
GPU_QUERY = (
    "index,name,uuid,driver_version,memory.total,persistence_mode,pcie.link.gen.max,"
    "pcie.link.width.current,ecc.errors.uncorrected.volatile.total,retired_pages.pending"
)
REMAPPED_QUERY = "gpu_uuid,remapped_rows.uncorrectable,remapped_rows.pending,remapped_rows.failure"


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    driver: str
    memory_mib: int | None
    persistence: bool
    pcie_gen_max: int | None
    pcie_width: int | None
    ecc_uncorrected: int | None  # None: not reported ([N/A], ECC off)
    retired_pending: bool | None


@dataclass(frozen=True)
class AllReduce:
    sizes: int  # message sizes measured
    largest_bytes: int
    busbw_gbs: float  # the better of out-of-place and in-place at the largest size
    wrong: int  # values that failed validation, over all sizes
    avg_busbw_gbs: float | None


def _number(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def _yes(text: str) -> bool | None:
    value = text.strip().lower()
    if value in ("yes", "enabled", "1", "true"):
        return True
    if value in ("no", "disabled", "0", "false"):
        return False
    return None


def parse_gpu_query(text: str) -> list[Gpu]:
    """Rows of `nvidia-smi --query-gpu=GPU_QUERY --format=csv,noheader,nounits`."""
    gpus = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 10 or not fields[0].isdigit():
            continue
        gpus.append(
            Gpu(
                index=int(fields[0]),
                name=fields[1],
                uuid=fields[2],
                driver=fields[3],
                memory_mib=_number(fields[4]),
                persistence=_yes(fields[5]) is True,
                pcie_gen_max=_number(fields[6]),
                pcie_width=_number(fields[7]),
                ecc_uncorrected=_number(fields[8]),
                retired_pending=_yes(fields[9]),
            )
        )
    return gpus


def parse_remapped_rows(text: str) -> dict[str, tuple[int | None, bool | None, bool | None]]:
    """uuid -> (uncorrectable remaps, remap pending, remap failure) from
    `nvidia-smi --query-remapped-rows=REMAPPED_QUERY --format=csv,noheader`."""
    out = {}
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 4 and fields[0].startswith("GPU-"):
            out[fields[0]] = (_number(fields[1]), _yes(fields[2]), _yes(fields[3]))
    return out


_NVLINK_GPU = re.compile(r"^GPU (\d+):")
_NVLINK_LINK = re.compile(r"^\s+Link (\d+): (.+)$")


def parse_nvlink_status(text: str) -> dict[int, tuple[int, int]]:
    """GPU index -> (links up, links listed) from `nvidia-smi nvlink --status`; a link is up
    when it reports a speed, down when it says <inactive>."""
    out: dict[int, tuple[int, int]] = {}
    current: int | None = None
    for line in text.splitlines():
        gpu = _NVLINK_GPU.match(line)
        if gpu:
            current = int(gpu.group(1))
            out[current] = (0, 0)
            continue
        link = _NVLINK_LINK.match(line)
        if link and current is not None:
            up, total = out[current]
            out[current] = (up + ("GB/s" in link.group(2)), total + 1)
    return out


def parse_all_reduce(text: str) -> AllReduce | None:
    """The result of an nccl-tests run (all_reduce_perf). Rows are read from the right, so both
    the older layout (no root column, float error) and the newer (#wrong) parse."""
    rows = []
    avg = None
    for line in text.splitlines():
        if line.startswith("# Avg bus bandwidth"):
            avg = float(line.split(":")[1])
            continue
        fields = line.split()
        if len(fields) < 10 or line.lstrip().startswith("#") or not fields[0].isdigit():
            continue
        try:
            size = int(fields[0])
            oop_busbw, oop_err = float(fields[-6]), float(fields[-5])
            ip_busbw, ip_err = float(fields[-2]), float(fields[-1])
        except ValueError:
            continue
        rows.append((size, max(oop_busbw, ip_busbw), oop_err + ip_err))
    if not rows:
        return None
    largest = max(rows)
    return AllReduce(
        sizes=len(rows),
        largest_bytes=largest[0],
        busbw_gbs=largest[1],
        wrong=int(sum(r[2] for r in rows)),
        avg_busbw_gbs=avg,
    )


@dataclass(frozen=True)
class GpuExpect:
    """What a node's profile and the spec promise."""

    count: int
    family: str  # e.g. h100: must appear in the GPU's name
    memory_gib: int
    driver: str | None  # "550" (branch) or "550.90.07"; None: not pinned
    nvlink_links: int
    pcie_gen: int | None
    pcie_width: int | None
    nvswitch: bool
    busbw_gbs: float | None
    # GPUs split into MIG instances: no NVLink between them, and a process drives one instance,
    # so neither the NVLink count nor an all_reduce across the node's GPUs applies
    mig: bool = False


# A GPU reports less memory than its name says (ECC's share, the driver's reservation): an
# L40S "48GB" reports 46068 MiB, an A10 or L4 "24GB" about 23000 MiB, a T4 "16GB" 15360 MiB.
# Up to this share under, and a little over, is the GPU the profile means; an A100 40GB in an
# 80GB profile, or an H100 NVL (94 GB) in an H100 80GB one, is not.
MEMORY_UNDER = 0.10
MEMORY_OVER = 0.05


def memory_matches(memory_mib: int | None, memory_gib: int) -> bool:
    if memory_mib is None:
        return False
    gib = memory_mib / 1024
    return memory_gib * (1 - MEMORY_UNDER) <= gib <= memory_gib * (1 + MEMORY_OVER)


Finding = tuple[str, bool, str]  # (check, passed, evidence)


def gpu_findings(
    want: GpuExpect,
    gpus: list[Gpu],
    remapped: dict[str, tuple[int | None, bool | None, bool | None]],
    nvlink: dict[int, tuple[int, int]],
) -> list[Finding]:
    out: list[Finding] = []
    names = sorted({g.name for g in gpus})
    family_ok = all(want.family.lower() in g.name.lower() for g in gpus)
    memory_ok = all(memory_matches(g.memory_mib, want.memory_gib) for g in gpus)
    out.append(
        (
            "gpu.count",
            len(gpus) == want.count and family_ok and memory_ok and bool(gpus),
            f"{len(gpus)} of {want.count} {want.family.upper()} {want.memory_gib} GB: "
            + (", ".join(names) or "none"),
        )
    )
    drivers = sorted({g.driver for g in gpus})
    if want.driver:
        pin = want.driver
        ok = bool(gpus) and all(d == pin or d.startswith(pin + ".") for d in drivers)
        out.append(("gpu.driver", ok, f"{', '.join(drivers) or 'none'} (pinned {pin})"))
    off = [g.index for g in gpus if not g.persistence]
    out.append(
        (
            "gpu.persistence",
            bool(gpus) and not off,
            f"off on GPU {off}" if off else "on for every GPU",
        )
    )
    bad = []
    for g in gpus:
        remap = remapped.get(g.uuid, (None, None, None))
        if g.ecc_uncorrected:
            bad.append(f"GPU {g.index}: {g.ecc_uncorrected} uncorrectable ECC errors")
        if g.retired_pending:
            bad.append(f"GPU {g.index}: page retirement pending")
        if remap[1]:
            bad.append(f"GPU {g.index}: row remap pending (reset the GPU)")
        if remap[2]:
            bad.append(f"GPU {g.index}: row remapping failed (replace the GPU)")
    out.append(("gpu.memory-errors", not bad, "; ".join(bad) or "none"))
    if want.pcie_gen or want.pcie_width:
        slow = [
            f"GPU {g.index}: gen {g.pcie_gen_max} x{g.pcie_width}"
            for g in gpus
            if (want.pcie_gen and (g.pcie_gen_max or 0) < want.pcie_gen)
            or (want.pcie_width and (g.pcie_width or 0) < want.pcie_width)
        ]
        out.append(
            (
                "gpu.pcie",
                bool(gpus) and not slow,
                "; ".join(slow) or f"gen {want.pcie_gen} x{want.pcie_width} on every GPU",
            )
        )
    if want.nvlink_links and want.mig:
        out.append(("gpu.nvlink", True, "not checked: MIG instances use no NVLink"))
    elif want.nvlink_links:
        down = [
            f"GPU {g.index}: {nvlink.get(g.index, (0, 0))[0]} of {want.nvlink_links} up"
            for g in gpus
            if nvlink.get(g.index, (0, 0))[0] < want.nvlink_links
        ]
        out.append(
            (
                "gpu.nvlink",
                bool(gpus) and not down,
                "; ".join(down) or f"{want.nvlink_links} links up on every GPU",
            )
        )
    return out


def all_reduce_finding(want: GpuExpect, result: AllReduce | None) -> Finding:
    if result is None:
        return ("nccl.all_reduce", False, "no result rows in the all_reduce_perf output")
    size = f"{result.largest_bytes / 2**30:g} GiB"
    if result.wrong:
        return ("nccl.all_reduce", False, f"{result.wrong} wrong values: the GPUs corrupt data")
    if want.busbw_gbs is None:
        return (
            "nccl.all_reduce",
            True,
            f"busbw {result.busbw_gbs:.1f} GB/s at {size} (no threshold in the profile)",
        )
    ok = result.busbw_gbs >= want.busbw_gbs
    return (
        "nccl.all_reduce",
        ok,
        f"busbw {result.busbw_gbs:.1f} GB/s at {size}, threshold {want.busbw_gbs:g}",
    )


# --- the commands and what they add up to, for verify (over SSH) and gpu-check.py (local) ---

ALL_REDUCE = "/opt/nccl-tests/build/all_reduce_perf"
QUERY_GPU = "query-gpu.csv"
REMAPPED_ROWS = "remapped-rows.csv"
NVLINK_STATUS = "nvlink-status.txt"
FABRICMANAGER = "fabricmanager.txt"
ALL_REDUCE_OUT = "all-reduce.txt"
DRIVER_STATE = "driver-state.txt"
# What explains an nvidia-smi that cannot reach the GPUs, in one look (POSIX sh, sysfs and
# kmod only): the running kernel, the NVIDIA display and 3D controllers on the PCI bus (vendor
# 0x10de, class 0x03), the driver's module as modinfo knows it for that kernel (NVIDIA's
# packages call it nvidia, Debian's own nvidia-current) and whether it is loaded.
DRIVER_STATE_COMMAND = (
    'k=$(uname -r); echo "kernel $k"; n=0; '
    "for d in /sys/bus/pci/devices/*; do "
    '[ "$(cat "$d/vendor" 2>/dev/null)" = 0x10de ] && '
    'case "$(cat "$d/class" 2>/dev/null)" in 0x03*) n=$((n+1));; esac; '
    'done; echo "pci $n"; '
    "for m in nvidia nvidia-current; do "
    'v=$(modinfo -k "$k" -F version "$m" 2>/dev/null) || continue; '
    'echo "module $m $v $(modinfo -k "$k" -F vermagic "$m" | cut -d" " -f1)"; break; done; '
    "grep -q '^nvidia ' /proc/modules 2>/dev/null && echo loaded; true"
)


@dataclass(frozen=True)
class DriverState:
    kernel: str
    pci_gpus: int | None  # NVIDIA display or 3D controllers on the PCI bus
    module: str  # as modinfo knows it; "" where none is installed for the kernel
    version: str
    built_for: str  # the kernel of the module's vermagic
    loaded: bool


def parse_driver_state(text: str) -> DriverState | None:
    """DRIVER_STATE_COMMAND's lines; None when they are not its (no kernel line)."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, _, rest = line.strip().partition(" ")
        found.setdefault(key, rest.split())
    if not found.get("kernel"):
        return None
    pci = found.get("pci") or [""]
    module = (found.get("module") or []) + ["", "", ""]
    return DriverState(
        kernel=found["kernel"][0],
        pci_gpus=int(pci[0]) if pci[0].isdigit() else None,
        module=module[0],
        version=module[1],
        built_for=module[2],
        loaded="loaded" in found,
    )


def driver_finding(want: GpuExpect, smi: str, state: DriverState | None) -> Finding:
    """Why nvidia-smi cannot reach the GPUs (`smi`: its first line), said once: no GPU on the
    PCI bus, no module for the running kernel, a module built for another, or one not loaded."""
    said = f"nvidia-smi failed: {smi}"
    if state is None:
        return ("gpu.count", False, said)
    fits = bool(state.module) and state.built_for == state.kernel
    module = (
        f"the driver's module ({state.module} {state.version}) is built for this kernel "
        f"({state.kernel})"
        if fits
        else f"the driver's module ({state.module} {state.version}) is built for "
        f"{state.built_for or 'no kernel'}, not the running {state.kernel}: DKMS builds it "
        "for a kernel whose headers are installed"
        if state.module
        else f"no NVIDIA kernel module is installed for the running kernel ({state.kernel})"
    )
    if state.pci_gpus == 0:
        why = (
            f"no NVIDIA GPU on the PCI bus (the profile promises {want.count}): {module}, and "
            "cannot load without one"
            if fits
            else f"no NVIDIA GPU on the PCI bus (the profile promises {want.count}); {module}"
        )
        return ("gpu.count", False, why)
    if fits and not state.loaded:
        return ("gpu.count", False, f"{said}; {module}, but not loaded (modprobe nvidia)")
    return ("gpu.count", False, f"{said}; {module}")


def gpu_commands(want: GpuExpect, all_reduce: str | None = ALL_REDUCE) -> dict[str, str]:
    """Output name -> shell command, for what `want` needs checked. The names are also the file
    names gpu-check.py records under."""
    commands = {
        QUERY_GPU: f"nvidia-smi --query-gpu={GPU_QUERY} --format=csv,noheader,nounits",
        REMAPPED_ROWS: f"nvidia-smi --query-remapped-rows={REMAPPED_QUERY} --format=csv,noheader",
    }
    if want.nvlink_links and not want.mig:
        commands[NVLINK_STATUS] = "nvidia-smi nvlink --status"
    if want.nvswitch:
        commands[FABRICMANAGER] = "systemctl is-active nvidia-fabricmanager"
    if all_reduce and not want.mig:
        # one process driving all of the node's GPUs, 1 to 8 GiB messages
        commands[ALL_REDUCE_OUT] = f"{all_reduce} -b 1G -e 8G -f 2 -g {want.count}"
    return commands


def findings_from(want: GpuExpect, outputs: dict[str, tuple[int, str]]) -> list[Finding]:
    """The findings from the (exit code, output) of each command of `gpu_commands`."""
    rc, query = outputs[QUERY_GPU]
    if rc != 0:
        # why, from DRIVER_STATE where it was asked (only then: gpu_commands has it not)
        first = query.strip().splitlines()[:1]
        code, state = outputs.get(DRIVER_STATE, (1, ""))
        return [
            driver_finding(
                want,
                first[0] if first else f"rc {rc}",
                parse_driver_state(state) if code == 0 else None,
            )
        ]

    def text(name: str) -> str:
        code, out = outputs.get(name, (1, ""))
        return out if code == 0 else ""

    found = gpu_findings(
        want,
        parse_gpu_query(query),
        parse_remapped_rows(text(REMAPPED_ROWS)),
        parse_nvlink_status(text(NVLINK_STATUS)),
    )
    if FABRICMANAGER in outputs:
        state = outputs[FABRICMANAGER][1].strip()
        found.append(("gpu.fabricmanager", state == "active", state))
    if ALL_REDUCE_OUT in outputs:
        code, out = outputs[ALL_REDUCE_OUT]
        result = parse_all_reduce(out)
        if code != 0 and result is None:
            first = out.strip().splitlines()[:1]
            found.append(
                ("nccl.all_reduce", False, f"did not run (rc {code}): {first[0] if first else ''}")
            )
        else:
            found.append(all_reduce_finding(want, result))
    return found
