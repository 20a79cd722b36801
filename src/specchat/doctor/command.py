"""`specchat doctor`: this machine measured (or one described by its sizes, nothing measured) and
the memory plan of a target and its draft on it."""

import sys
from pathlib import Path

from specchat.doctor.advice import advise
from specchat.doctor.choices import choice_lines
from specchat.doctor.facts import gather, probe_room
from specchat.doctor.limit import measure_limit
from specchat.doctor.plan import PairPlan, doctor_options, doctor_plan
from specchat.doctor.report import render, render_described
from specchat.engine_options import EngineOptions
from specchat.errors import PlanRefusal, SpecchatError
from specchat.limits import CONTEXT, check_memory_budgets
from specchat.machine_links import Links, save_links
from specchat.paths import offload_dir as default_offload_dir
from specchat.plan import Machine

MACHINE_FIGURE_MAX = 1e6  # a described machine's GB or GB/s: past any machine, and bytes an int holds


def run_doctor(target: str, draft: str | None, context: int | None, machine: Machine, offload_dir: Path | None,
               probe_gb: float, ram_budget: float | None, vram_budget: float | None,
               measure_again: bool, slots: int | None) -> str:
    """The report: for a described machine from its sizes alone; for this one after measuring its
    links (and remembering them for the engines), with the choices it keeps (measured again first
    with `measure_again`); planned for `slots` conversations kept at once (serve's --slots; None: auto)."""
    check_numbers(machine, ram_budget, vram_budget, context)
    if measure_again and machine.described:
        raise SpecchatError("--measure-again measures this machine's kept choices: give no described machine")
    directory = offload_dir or default_offload_dir()
    if machine.described:
        options = doctor_options(target, draft, context, directory, ram_budget, vram_budget)
        return render_described(machine, plan_or_reason(options, machine, slots))
    directory, probe_bytes = probe_room(directory, probe_gb)
    print(f"measuring (writes, reads and deletes a {probe_gb:g} GB probe file)...", file=sys.stderr)
    facts = gather(directory, probe_bytes)
    save_links(Links(ram_gbps=facts.h2d_gbps, disk_gbps=facts.disk_gbps))
    measured = Machine(disk_gbps=facts.disk_gbps, pcie_gbps=facts.h2d_gbps)
    options = doctor_options(target, draft, context, facts.offload_dir, ram_budget, vram_budget)
    pair = plan_or_reason(options, measured, slots)
    limit = None if facts.cuda else measure_limit(options, slots)
    rec = advise(pair, bool(facts.cuda), facts.h2d_gbps, facts.disk_gbps) if isinstance(pair, PairPlan) else None
    return "\n".join([render(facts, target, rec, pair, limit), *choice_lines(measure_again)])


def plan_or_reason(options: EngineOptions, machine: Machine, slots: int | None) -> PairPlan | str:
    """The plan, or the one line saying why the pair fits nowhere (bad options still raise)."""
    try:
        return doctor_plan(options, machine, slots)
    except PlanRefusal as error:
        return str(error)


def check_numbers(machine: Machine, ram_budget: float | None, vram_budget: float | None, context: int | None) -> None:
    check_memory_budgets(ram_budget, vram_budget)
    if context is not None:
        CONTEXT.check("--context", context)
    for name, value in (("--vram-gb", machine.vram_gb), ("--ram-gb", machine.ram_gb),
                        ("--disk-gbps", machine.disk_gbps), ("--pcie-gbps", machine.pcie_gbps)):
        if value is not None and not 0 < value <= MACHINE_FIGURE_MAX:
            raise SpecchatError(f"{name} must be a positive number up to {MACHINE_FIGURE_MAX:g} (got {value})")
