"""kserve: what KServe accepts and the command it really runs (InferenceService, LLMInferenceService, facts, twin)."""
