"""The day-N re-check (docs/recheck.md): an orchestrator at the report's level. It reads the signed run through
RunDir, runs a subset of the registered probes and the read-only node checks with light settings (plan.py), and
writes its report through report/ (report.py); the judgement of today against the signed baseline is judge.py."""
