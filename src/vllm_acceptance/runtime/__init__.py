"""What serve and the probes share to reach a running server: process supervision (process.py), the
OpenAI-compatible HTTP client (client.py) and metrics reading (metrics.py). It imports only core."""
