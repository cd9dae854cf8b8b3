"""The machine check's verdicts: a sentence a person can act on for each figure that matters.

Plain functions over a ``MachineCheck`` (``ampscope.core.machine.check``), so every rule is
tested with made-up figures: a GPU's share of its datasheet, what holds it back (power limit,
throttled clocks, a narrow PCIe link), and on a CPU bf16 and fp16 against fp32 with the reason
(the units it has or lacks).
"""

from __future__ import annotations

from collections.abc import Callable

from ampscope.core.machine import steady
from ampscope.core.machine.check import GpuState, MachineCheck, MatmulFigure
from ampscope.core.machine.hardware import CPU_UNITS

# A dense matmul reaching this share of the datasheet is healthy (an H100 SXM reaches about
# 0.8 in bf16, MAMF-finder style sweeps); below LOW something holds the device back.
TYPICAL_MATMUL = 0.6
LOW_MATMUL = 0.4
TYPICAL_MEMORY = 0.7  # an H200 copies at about 4.3 of its 4.8 TB/s

# What one PCIe lane carries per direction, GB/s, after line coding (PCI-SIG figures).
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
TYPICAL_H2D = 0.5  # pinned copies reach 0.7-0.85 of the link; under half points at the host


def pct(ratio: float) -> str:
    return f"{ratio * 100:.0f} %"


def matmul_verdicts(check: MachineCheck) -> list[str]:
    if check.kind == "cpu":
        return cpu_verdicts(check.matmul, check.cpu_units, check.trusted)
    said = []
    typical = [
        (f, fig.ratio) for f, fig in check.matmul.items() if (fig.ratio or 0) >= TYPICAL_MATMUL
    ]
    if typical:  # one line for every healthy format: the ones that are not stand out
        shares = ", ".join(f"{f} {pct(r or 0.0)}" for f, r in typical)
        said.append(
            f"{typical[0][0]} matmul at {pct(typical[0][1] or 0.0)} of the datasheet: typical for "
            "this GPU"
            if len(typical) == 1
            else f"matmul at {shares} of the datasheet: typical for this GPU"
        )
    for fmt, fig in check.matmul.items():
        if fig.ratio is None:
            said.append(
                f"{fmt} matmul {fig.tflops:.3g} TFLOP/s: no datasheet figure for "
                f"'{check.device}' to compare with"
            )
        elif fig.ratio >= TYPICAL_MATMUL:
            continue
        elif fig.ratio >= LOW_MATMUL:
            said.append(
                f"{fmt} matmul at {pct(fig.ratio)} of the datasheet: below the usual "
                f"{pct(TYPICAL_MATMUL)}-85 %; see the power, clock and other-process lines"
            )
        else:
            said.append(
                f"{fmt} matmul at {pct(fig.ratio)} of the datasheet: far below normal; another "
                "process on the GPU, a power cap or throttled clocks (nvidia-smi -q -d "
                "PERFORMANCE,POWER)"
            )
    return said


def cpu_verdicts(
    matmul: dict[str, MatmulFigure],
    units: list[str],
    trusted: Callable[[str], bool] = lambda fmt: True,
) -> list[str]:
    """How bf16 and fp16 compare with fp32 on this CPU, and why: the units it has or lacks.
    A ratio of figures the machine was too busy to measure (``trusted`` says which) is no
    verdict: the units it has or lacks are said, the ratio only as what was seen."""
    fp32 = matmul.get("fp32")
    said = []
    for fmt, candidates in CPU_UNITS.items():
        fig = matmul.get(fmt)
        if fig is None or fp32 is None or fp32.tflops <= 0:
            continue
        x = fig.tflops / fp32.tflops
        have = [label for flag, label in candidates if flag in units]
        names = " or ".join(label for _, label in candidates)
        if not (trusted(fmt) and trusted("fp32")):
            units_text = f"its {have[0]} units" if have else f"no {names} units"
            said.append(
                f"{fmt} matmul ran at {x:.2g}x fp32 while the machine was too busy to measure: "
                f"no verdict on {fmt} against fp32 (this CPU has {units_text})"
            )
        elif not have:
            units_text = "AMX or AVX512-BF16" if fmt == "bf16" else "AMX-FP16 or AVX512-FP16"
            said.append(
                f"{fmt} matmul runs at {x:.2g}x fp32 here: this CPU has no {units_text} units"
                + (f", so {fmt} presets train slower than fp32 on it" if x < 1 else "")
            )
        elif x >= 1:
            said.append(f"{fmt} matmul runs at {x:.2g}x fp32 here, on its {have[0]} units")
        else:
            said.append(
                f"{fmt} matmul runs at {x:.2g}x fp32 here although this CPU has {have[0]} "
                f"units: torch may not use them (check torch.backends.cpu.get_cpu_capability(); "
                f"looked for {names})"
            )
    return said


def memory_verdicts(check: MachineCheck, link_gbps: float | None) -> list[str]:
    said = []
    if check.memory_gbps is not None and check.memory_datasheet_gbps:
        ratio = check.memory_gbps / check.memory_datasheet_gbps
        said.append(
            f"memory copy at {pct(ratio)} of the datasheet: typical"
            if ratio >= TYPICAL_MEMORY
            else f"memory copy at {pct(ratio)} of the datasheet: low (usual: "
            f"{pct(TYPICAL_MEMORY)} or more); ECC errors, memory clocks or another process"
        )
    if check.h2d_gbps is not None and link_gbps and check.h2d_gbps < TYPICAL_H2D * link_gbps:
        said.append(
            f"pinned host-to-device at {check.h2d_gbps:.3g} GB/s, under half of what the "
            f"PCIe link carries ({link_gbps:.3g} GB/s): the GPU's NUMA node, an IOMMU or a "
            "shared switch"
        )
    return said


def state_verdicts(state: GpuState | None) -> list[str]:
    """Power limit, clock throttling and PCIe link, said only when they hold the GPU back."""
    if state is None:
        return []
    said = []
    if (
        state.power_limit_w is not None
        and state.power_max_w is not None
        and state.power_limit_w < 0.95 * state.power_max_w
    ):
        said.append(
            f"power limit {state.power_limit_w:.0f} W of {state.power_max_w:.0f} W: the GPU is "
            "capped below its rating (nvidia-smi -pl raises it, as root)"
        )
    for reason in state.throttle:
        said.append(THROTTLE_TEXT.get(reason, f"SM clock held down ({reason})"))
    if state.pcie_gen is not None and state.pcie_width is not None:
        gen_low = state.pcie_max_gen is not None and state.pcie_gen < state.pcie_max_gen
        width_low = state.pcie_max_width is not None and state.pcie_width < state.pcie_max_width
        if gen_low or width_low:
            said.append(
                f"PCIe Gen{state.pcie_gen} x{state.pcie_width}, where the GPU supports "
                f"Gen{state.pcie_max_gen} x{state.pcie_max_width}: host-device copies are slower "
                "(a riser, the slot, or BIOS settings)"
            )
    return said


THROTTLE_TEXT = {
    "sw_power_cap": "SM clock throttled (power cap): the GPU is at its power limit",
    "hw_slowdown": "SM clock throttled (hardware slowdown: power brake or overheating)",
    "sw_thermal": "SM clock throttled (thermal): the GPU is too hot; check cooling and airflow",
    "hw_thermal": "SM clock throttled (thermal, hardware): the GPU is too hot; check cooling",
    "power_brake": "SM clock throttled (power brake asserted by the system)",
    "board_limit": "SM clock throttled (board limit)",
    "reliability": "SM clock throttled (reliability voltage limit)",
    "sync_boost": "SM clock held to its sync-boost group's slowest GPU",
}


def pcie_link_gbps(state: GpuState | None) -> float | None:
    if state is None or state.pcie_gen is None or not state.pcie_width:
        return None
    lane = PCIE_LANE_GBPS.get(state.pcie_gen)
    return lane * state.pcie_width if lane else None


def judge(check: MachineCheck) -> list[str]:
    """Every verdict: a figure the machine was too busy to measure first (it is not kept as a
    peak), then the device's state (the likely cause of a low figure), then each figure."""
    return [
        *busy_verdicts(check),
        *state_verdicts(check.gpu_state),
        *thread_verdicts(check),
        *matmul_verdicts(check),
        *memory_verdicts(check, pcie_link_gbps(check.gpu_state)),
    ]


def busy_verdicts(check: MachineCheck) -> list[str]:
    """Other processes holding the CPUs a CPU check needed, and the figures whose rounds
    disagreed by more than ``steady.STEADY_SPREAD``: one sentence."""
    contention = None
    if check.contended:
        threads = check.threads or 0
        contention = (
            f"other processes kept {check.other_cpus:.1f} of its {check.cpus} CPUs busy during "
            f"the check, where its {threads} thread{'s' if threads > 1 else ''} needed them"
        )
    unsteady = [(what, r) for what, r in check.rounds_of() if not steady.steady(r)]
    said = steady.busy_verdict(unsteady, check.load_average, contention)
    return [said] if said else []


def thread_verdicts(check: MachineCheck) -> list[str]:
    """A CPU whose threads gain nothing over one: other processes hold its cores, and a
    small matmul's threads wait on each other for whole scheduler slices."""
    fp32, one = check.matmul.get("fp32"), check.fp32_one_thread_tflops
    if check.kind != "cpu" or fp32 is None or not one or not check.threads or check.threads < 2:
        return []
    if fp32.tflops >= 1.2 * one:
        return []
    load = f" (load average {check.load_average:.1f})" if check.load_average is not None else ""
    return [
        f"fp32 matmul on {check.threads} threads runs at {fp32.tflops / one:.2g}x one thread: "
        f"other processes are using the cores{load}; every figure here is lower than on an "
        "idle machine (OMP_NUM_THREADS=1 or fewer threads may train faster)"
    ]
