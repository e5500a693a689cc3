"""The check catalog: every check id the product can write, registered once (see docs/checks.md)."""

from __future__ import annotations

from .registry import register

# --- agent interface (probes/agent.py sends and records; rules/agent.py judges) ---------------------
_AGENT = "SPEC 'Agent interface'"
_AG = "block_agent_traffic"
register("agent.tool_schemas", stage="agent", consequence=_AG, title="Tool schemas are valid JSON Schemas",
         rule="every tool's parameters meta-validate as JSON Schema before any request is sent",
         evidence="tool_schemas.json (the scenario pack's tools)", source=_AGENT)
register("agent.tool_call", stage="agent", consequence=_AG, title="Tool calls are well-formed (rate with its bound)",
         rule="tool_calls present, names from the schema, arguments valid JSON per schema; the format-error rate's "
              "95 % upper bound over the turns <= thresholds.tool_format_error_rate; errors below it are a limited "
              "observation only when the validated retry recovered every one",
         evidence="turns.json (every turn's request, raw response, check), retries.json", source=_AGENT)
register("agent.schema_accuracy", stage="agent", consequence=_AG, title="Schema accuracy resolves its minimum",
         rule="valid calls / calls with finish_reason tool_calls; its 95 % lower bound >= "
              "thresholds.schema_accuracy_min",
         evidence="turns.json", source=_AGENT + "; Kimi Vendor Verifier schema accuracy")
register("agent.trigger_consistency", stage="agent", consequence=_AG, title="The same input triggers the same call",
         rule="repeated turns of one input trigger the same call (name and arguments)", evidence="turns.json",
         source=_AGENT)
register("agent.separation", stage="agent", consequence=_AG, title="Content, reasoning and tool calls apart",
         rule="no tool-call or reasoning markup in content; a leak rate whose bound is under the threshold and "
              "that the retry recovers is a limited observation", evidence="turns.json", source=_AGENT)
register("agent.stream_consistency", stage="agent", consequence=_AG, title="Streamed and non-streamed replies agree",
         rule="the assembled stream carries the non-streamed reply's tool calls (and, with a reasoning parser, its "
              "reasoning and content)", evidence="cases/*-stream-*.json", source=_AGENT)
register("agent.stream_structure", stage="agent", consequence=_AG, title="Streamed tool-call deltas are consistent",
         rule="every tool-call delta names its index; indexes start at 0 and rise by one; id and name arrive once "
              "and never change", evidence="cases/*-stream-streamed.json (raw stream)", source=_AGENT)
register("agent.multi_turn", stage="agent", consequence=_AG, title="Multi-turn order kept",
         rule="user -> assistant tool call -> tool result -> assistant", evidence="cases/*-multi-turn-*.json",
         source=_AGENT)
register("agent.tool_failure_fallback", stage="agent", consequence=_AG,
         title="A failed tool result leads to the planned fallback",
         rule="the deployment's answers to a failed tool result follow the scenario pack's fallback plan "
              "(retry of the same call, a schema-valid ticket, a user-facing answer that states no missing data)",
         evidence="cases/*-fallback-*.json", source=_AGENT)
register("agent.structured_output", stage="agent", consequence=_AG,
         title="Structured output: valid kept, broken rejected",
         rule="a response_format json_schema answer validates; a real broken body from the server (cut by max_tokens) "
              "is rejected by the client validation and carries finish_reason length",
         evidence="cases/*-structured-*.json (raw bodies)", source=_AGENT)
register("agent.executor_safety", stage="agent", consequence=_AG, title="Real calls through the reference client",
         rule="every tool call the deployment returned: validated -> executed or refused predictably; a write "
              "delivered twice, or re-sent as one operation, runs once per idempotency key",
         evidence="executor.json (per call: raw call, validation, outcome)", source=_AGENT)
register("agent.multimodal", stage="agent", consequence=_AG, title="A multimodal request where images are taken",
         rule="an image request is answered where the profile says the service takes images",
         evidence="cases/*-multimodal-*.json", source=_AGENT)
register("agent.client_library", stage="agent", consequence=_AG, title="The client library keeps every raw field",
         rule="openai ChatCompletion.model_validate keeps every field of the raw HTTP JSON",
         evidence="client-library.json", source=_AGENT)
register("agent.gateway", stage="agent", consequence=_AG, title="Gateway keeps the structure",
         rule="direct and gateway responses have the same fields and types", evidence="cases/*-gateway-*.json",
         source=_AGENT)
register("agent.timeouts", stage="agent", consequence=_AG, title="Every agent request answered in time",
         rule="a request without a complete answer within agent.request_timeout_s decides nothing",
         evidence="cases/*.json of the hung requests", source=_AGENT)
register("agent.probe", stage="agent", consequence=_AG, title="The agent probe ran to its end",
         rule="a probe that breaks inside is a missing stage", evidence="probe-error.txt", source=_AGENT)

# --- prefix-cache reuse (probes/cache.py sends and records; rules/cache.py judges) -------------------
_CACHE = "SPEC 'Prefix-cache reuse'"
register("cache.metrics", stage="cache", consequence="rebuild_environment", title="Cache metrics readable",
         rule="every counter of the protocol is exported and readable", evidence="metrics/*.prom", source=_CACHE)
register("cache.config", stage="cache", consequence="rebuild_environment", title="Prefix caching on (actual config)",
         rule="enable_prefix_caching label of vllm:cache_config_info is True", evidence="metrics/001-initial.prom",
         source=_CACHE)
register("cache.reuse", stage="cache", consequence="rebuild_environment", title="Reuse measurable",
         rule="prefix caching on and measurable before the protocol runs", evidence="metrics/001-initial.prom",
         source=_CACHE)
register("cache.isolation", stage="cache", consequence="rebuild_environment", title="Each request measured alone",
         rule="idle before/after, request counter +1, queries = prompt tokens", evidence="requests.json", source=_CACHE)
register("cache.cold_baseline", stage="cache", consequence="rebuild_environment", title="Cold requests do not hit",
         rule="cold hits stay within the template's head before the session id", evidence="requests.json",
         source=_CACHE)
register("cache.control", stage="cache", consequence="rebuild_environment", title="A changed prefix drops reuse",
         rule="hits <= block-aligned common prefix of the control", evidence="requests.json", source=_CACHE)
register("cache.hot_reuse", stage="cache", consequence="rebuild_environment", title="Hot requests reuse the prefix",
         rule="hot hits equal the block-aligned shared prefix (hybrid: above the template head, step-shaped)",
         evidence="requests.json", source=_CACHE)
register("cache.repeat_rounds", stage="cache", consequence="rebuild_environment",
         title="Repeated rounds on one hot prefix keep hitting",
         rule="the same hot prefix re-sent over several rounds hits the shared prefix from the second round on "
              "(hybrid: within one retention interval, the first repeat may only create the retention)",
         evidence="requests.json", source=_CACHE)
register("cache.prefill_gain", stage="cache", consequence="rebuild_environment", title="Prefill work drops with hits",
         rule="new computed prefill tokens and prefill time drop with the hits", evidence="requests.json",
         source=_CACHE)
register("cache.source", stage="cache", consequence="rebuild_environment", title="Hits are local reuse",
         rule="prefix_cache_hits from the device/host tier; vllm:prompt_tokens_cached = local + external hits; "
              "external_prefix_cache_* never pass for local reuse", evidence="requests.json", source=_CACHE)
register("cache.restart", stage="cache", consequence="rebuild_environment", title="Hot again after a restart",
         rule="after a restart (new process start time) the hot request's local hits are near zero; hits from an "
              "external KV connector are shown as external", evidence="requests.json, metrics/*restart*.prom",
         source=_CACHE + " (seed 001)")
register("cache.timeouts", stage="cache", consequence="rebuild_environment",
         title="Every cache request answered in time",
         rule="a request without a complete answer within cache.request_timeout_s decides nothing",
         evidence="requests/*.json", source=_CACHE)
register("cache.crash", stage="cache", consequence="rebuild_environment", title="The server lived through the protocol",
         rule="the protocol runs to its end on one live instance", evidence="crash_record.json", source=_CACHE)
register("cache.probe", stage="cache", consequence="rebuild_environment", title="The cache probe ran to its end",
         rule="a probe that breaks inside is a missing stage", evidence="probe-error.txt", source=_CACHE)
