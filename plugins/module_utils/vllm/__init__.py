"""vllm: what vLLM accepts and what it says (speculative config rules, command line, engine log, metrics)."""
