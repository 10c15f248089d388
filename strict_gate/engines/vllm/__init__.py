"""vLLM offline (`vllm.LLM` in process): the engine, its argument checks, its outputs read into records."""
