"""kube: talking to the API server (the only importer of the kubernetes client package), pods and logs, the generic wait."""
