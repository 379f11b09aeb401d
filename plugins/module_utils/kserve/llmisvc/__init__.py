"""kserve.llmisvc: KServe's LLMInferenceService (model, render, flags and presets, status, cluster reads, twin)."""
