"""``--verify``'s table: each run read back from its record, as ``ampscope bench`` reads one.

The rows are ``core.comparison``'s (the same final loss, skipped steps, median step time and
verdict sentences as ``bench``), compared with the baseline run: amp-bf16 for both targets. A
run that was not run (torchao's auto filter converting nothing) is a row that says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ampscope.core import records
from ampscope.core.comparison import Row, compare, row_from_runs, verdicts
from ampscope.core.plan.report import VerifyRow
from ampscope.core.units import fmt_ms


@dataclass
class Outcome:
    """One variant as it went: its row name, the preset it ran, its record (None: not run)
    and why it was not run."""

    name: str
    preset: str
    record: records.RunRecord | None
    skip: str | None = None


def verify_rows(outcomes: Sequence[Outcome], baseline: str) -> list[VerifyRow]:
    rows = [row_from_runs(o.name, [o.record]) for o in outcomes if o.record is not None]
    compare(rows, baseline)
    by_name = {row.preset: row for row in rows}
    base = by_name.get(baseline)
    out = []
    for o in outcomes:
        row = by_name.get(o.name)
        if row is None:
            out.append(
                VerifyRow(
                    name=o.name,
                    preset=o.preset,
                    final_loss=None,
                    loss_gap=None,
                    skipped_steps=0,
                    step_ms=None,
                    status="not run",
                    verdict=f"{o.name}: not run: {o.skip or 'no record'}.",
                )
            )
            continue
        out.append(
            VerifyRow(
                name=o.name,
                preset=o.preset,
                final_loss=row.loss_final,
                loss_gap=row.loss_change,
                skipped_steps=row.skipped_steps,
                step_ms=row.step_ms,
                status=row.status,
                verdict=_verdict(row, base, baseline),
            )
        )
    return out


def _verdict(row: Row, base: Row | None, baseline: str) -> str:
    if row is base:
        if row.status != "ok":  # what every other row is compared with did not finish
            why = (row.reason or "see its run record").rstrip(".")
            return f"{row.preset}: the baseline, {row.status}: {why}; no row is compared with it."
        return f"{row.preset}: the baseline."
    return " ".join(verdicts([r for r in (base, row) if r is not None], baseline))


def table(rows: Sequence[VerifyRow]) -> list[str]:
    """The rows as a terminal table, then each row's verdict."""
    heads = ["run", "final loss", "vs baseline", "skipped", "step time", "status"]
    body = [
        [
            r.name,
            f"{r.final_loss:.4f}" if r.final_loss is not None else "-",
            f"{r.loss_gap:+.1%}" if r.loss_gap is not None else "-",
            str(r.skipped_steps),
            fmt_ms(r.step_ms) if r.step_ms is not None else "-",
            r.status,
        ]
        for r in rows
    ]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(heads)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths, strict=True)).rstrip() for b in body]
    return lines + [r.verdict for r in rows]
