"""kserve.isvc: the InferenceService (render, readers, runtime merge and selection, patch plans)."""
