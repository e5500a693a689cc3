"""vllm-acceptance: decide with evidence whether a vLLM deployment may take production traffic."""

__version__ = "0.1.0"
