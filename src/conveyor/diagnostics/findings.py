"""What a pre-flight check finds: a :class:`Finding` each, gathered in a :class:`Report`.

A finding says what is wrong, where (an attribute path such as
``dataset.db.conn``, or ``environment``), why it matters and how to fix it —
in that order, in plain words. ``code`` is a stable short name
(``shared-sqlite``) that programs and documentation can refer to.
"""

from __future__ import annotations

import enum
import textwrap
from dataclasses import dataclass

__all__ = ["ENVIRONMENT", "Finding", "Report", "Severity"]

ENVIRONMENT = "environment"  # ``where`` of a finding about the machine, not an object
_WIDTH = 88


class Severity(enum.IntEnum):
    """How bad a finding is. The values are :mod:`logging`'s levels."""

    INFO = 20  #: worth knowing; nothing to fix
    WARNING = 30  #: works, but wrongly or slowly: fix it
    ERROR = 40  #: fails, corrupts data or deadlocks: the loader refuses to start


@dataclass(frozen=True)
class Finding:
    """One problem: ``what`` is wrong, ``where``, ``why`` it matters, and the ``fix``."""

    code: str  #: a stable short name, such as ``shared-sqlite``
    severity: Severity  #: how bad it is
    where: str  #: an attribute path (``dataset.db.conn``), or ``environment``
    what: str  #: what is wrong
    why: str  #: why it matters
    fix: str  #: how to fix it

    def message(self) -> str:
        """One paragraph: what (where). Why. Fix: how."""
        place = "in the environment" if self.where == ENVIRONMENT else f"at {self.where}"
        return f"{self.what} ({place}). {self.why} Fix: {self.fix}"


@dataclass(frozen=True)
class Report:
    """Everything a check found, worst first; ``str(report)`` is meant for a terminal.

    ``subject`` says what was checked (``"mypkg.Images (4 workers, start method
    'fork')"``). ``ok`` is true when nothing needs fixing: no error, no warning
    (INFO findings are for reading).
    """

    findings: tuple[Finding, ...] = ()  #: every finding, worst first
    subject: str = ""  #: what was checked

    @property
    def errors(self) -> tuple[Finding, ...]:
        """The ERROR findings: the loader refuses to start."""
        return self._at(Severity.ERROR)

    @property
    def warnings(self) -> tuple[Finding, ...]:
        """The WARNING findings: it works, but wrongly or slowly."""
        return self._at(Severity.WARNING)

    @property
    def infos(self) -> tuple[Finding, ...]:
        """The INFO findings: worth knowing, nothing to fix."""
        return self._at(Severity.INFO)

    @property
    def ok(self) -> bool:
        """True when nothing needs fixing: no error, no warning."""
        return not self.errors and not self.warnings

    def codes(self) -> list[str]:
        """The findings' codes, worst first (handy in tests and scripts)."""
        return [f.code for f in self.findings]

    def _at(self, severity: Severity) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == severity)

    def __str__(self) -> str:
        title = "conveyor check" + (f" of {self.subject}" if self.subject else "")
        if not self.findings:
            return f"{title}: no problems found."
        counts = [
            plural(len(group), name)
            for group, name in ((self.errors, "error"), (self.warnings, "warning"))
            if group
        ]
        lines = [f"{title}: {', '.join(counts) or 'nothing to fix'}."]
        for severity in sorted(Severity, reverse=True):
            group = self._at(severity)
            if not group:
                continue
            lines.append("")
            heading = _HEADINGS[severity]
            lines.append(heading if len(group) > 1 else heading[:-1])  # "WARNING" for one
            for number, finding in enumerate(group, 1):
                lines.extend(_render(number, finding))
        return "\n".join(lines)


_HEADINGS = {Severity.ERROR: "ERRORS", Severity.WARNING: "WARNINGS", Severity.INFO: "NOTES"}


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _render(number: int, finding: Finding) -> list[str]:
    indent = " " * 5
    place = "environment" if finding.where == ENVIRONMENT else finding.where
    lines = [f"  {number}. {place}  [{finding.code}]"]
    for text in (finding.what + ".", finding.why, f"Fix: {finding.fix}"):
        lines += textwrap.wrap(
            text,
            _WIDTH,
            initial_indent=indent,
            subsequent_indent=indent,
            break_long_words=False,
            break_on_hyphens=False,
        )
    return lines
