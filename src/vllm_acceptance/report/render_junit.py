"""junit.xml: one test case per finding, so CI systems show the acceptance like a test run.

classname is the check family (`compat`, `capacity`, ...), name is `check@host`. Mapping:
fail -> <failure>; missing and inconclusive -> <error> (the check could not be judged: never a
pass); not_applicable -> <skipped>; warn -> passes, with the defect in <system-out>; pass -> passes.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from typing import Any

# XML 1.0 cannot carry most control characters; a raw log line may hold them.
_XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _text(value: Any) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return _XML_ILLEGAL.sub("\ufffd", text)


def case_name(finding: dict[str, Any]) -> str:
    host = finding.get("host")
    return f"{finding.get('check')}@{host}" if host else str(finding.get("check"))


def describe(finding: dict[str, Any]) -> str:
    lines = [f"observed: {_text(finding.get('observed'))}", f"expected: {_text(finding.get('expected'))}"]
    for key in ("rule", "reason", "action", "layer", "consequence", "owner", "recheck_date"):
        if finding.get(key):
            lines.append(f"{key}: {_text(finding.get(key))}")
    for path in finding.get("evidence") or []:
        lines.append(f"evidence: {_text(path)}")
    return "\n".join(lines)


def render_junit(report: dict[str, Any]) -> str:
    findings = list(report.get("findings") or [])
    suite = ET.Element("testsuite", {
        "name": _text(f"vllm-acceptance.{report.get('inventory')}.{report.get('profile')}"),
        "tests": str(len(findings)),
        "failures": str(sum(f.get("status") == "fail" for f in findings)),
        "errors": str(sum(f.get("status") in ("missing", "inconclusive") for f in findings)),
        "skipped": str(sum(f.get("status") == "not_applicable" for f in findings)),
        "timestamp": _text(report.get("started") or report.get("finished") or ""),
    })
    props = ET.SubElement(suite, "properties")
    for key in ("verdict", "run_id", "inventory", "profile", "schema_version"):
        ET.SubElement(props, "property", {"name": key, "value": _text(report.get(key))})
    for name, gate in sorted((report.get("gates") or {}).items()):
        if isinstance(gate, dict):
            state = "open" if gate.get("open") else "blocked"
            ET.SubElement(props, "property", {"name": f"gate.{name}", "value": f"{state}: {_text(gate.get('reason'))}"})
    for finding in findings:
        status = finding.get("status")
        case = ET.SubElement(suite, "testcase", {"classname": str(finding.get("check", "")).split(".", 1)[0],
                                                  "name": _text(case_name(finding)), "time": "0"})
        body = describe(finding)
        headline = _text(f"{status}: observed {_text(finding.get('observed'))}; "
                         f"expected {_text(finding.get('expected'))}")[:500]
        if status == "fail":
            ET.SubElement(case, "failure", {"message": headline, "type": "fail"}).text = body
        elif status in ("missing", "inconclusive"):
            ET.SubElement(case, "error", {"message": headline, "type": str(status)}).text = body
        elif status == "not_applicable":
            ET.SubElement(case, "skipped", {"message": _text(finding.get("reason") or "not applicable")})
        elif status == "warn":
            ET.SubElement(case, "system-out").text = "WARN (passes with a controlled mitigation)\n" + body
        else:
            ET.SubElement(case, "system-out").text = body
    root = ET.Element("testsuites", {"name": "vllm-acceptance", "tests": suite.get("tests", "0"),
                                     "failures": suite.get("failures", "0"), "errors": suite.get("errors", "0"),
                                     "skipped": suite.get("skipped", "0")})
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
