"""Probes against a running server. Each writes DIR/result.json (contract 3) and its evidence."""
