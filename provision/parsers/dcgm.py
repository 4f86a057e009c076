"""DCGM's diagnostics (`dcgmi diag -r LEVEL -j`): which tests failed, on which GPU, and why.

The JSON is the one DCGM's validation suite writes (its JsonOutput): tests grouped in
categories, one result per GPU (one for all GPUs for the software tests), each with a status
(Pass, Fail, Warn, Skip) and optional warnings. DCGM 3 names the document "DCGM GPU
Diagnostic"; later releases "DCGM Diagnostic". Warnings are strings in older releases and
{"warning": text, "error_id": n} objects in newer ones. Standard library only: the health
program runs this on the nodes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

# seconds a level takes at most on an 8-GPU node (DCGM's guide: level 1 seconds, level 2 about
# two minutes, level 3 about half an hour), with room to spare
DIAG_TIMEOUT_S = {1: 300, 2: 1200, 3: 5400}
# from this level on a diagnostic runs for minutes: periodically, it runs from its own timer
LONG_DIAG_FROM = 2
_ROOTS = ("DCGM GPU Diagnostic", "DCGM Diagnostic")


def diag_command(level: int) -> str:
    return f"dcgmi diag -r {int(level)} -j"


@dataclass
class DiagReport:
    tests: int = 0  # results read (a test on one GPU, or a software test for all)
    failures: list[str] = field(default_factory=list)  # "test (GPU n): first warning"
    version: str = ""


def _warning(item: object) -> str:
    if isinstance(item, dict):
        return str(item.get("warning") or item.get("message") or "")
    return str(item)


def parse_diag(text: str) -> DiagReport | None:
    """The report in dcgmi's output (it may print a line before the JSON), or None when the
    output holds no diagnostic document."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        return None
    try:
        document = json.loads(text[start : end + 1])
    except ValueError:
        return None
    root = next((document[k] for k in _ROOTS if isinstance(document.get(k), dict)), None)
    if root is None:
        return None
    report = DiagReport(version=str(root.get("version", "")))
    for category in root.get("test_categories") or []:
        for test in category.get("tests") or []:
            name = str(test.get("name", "?"))
            for result in test.get("results") or []:
                if not isinstance(result, dict):
                    continue  # DCGM leaves null where a GPU index has no result
                report.tests += 1
                if str(result.get("status", "")).lower() != "fail":
                    continue
                gpus = result.get("gpu_ids", result.get("gpu_id", result.get("entity_id")))
                warnings = [w for w in map(_warning, result.get("warnings") or []) if w]
                where = f" (GPU {gpus})" if gpus not in (None, "") else ""
                why = f": {warnings[0]}" if warnings else ""
                report.failures.append(f"{name}{where}{why}")
    return report
