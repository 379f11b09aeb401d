"""artifacts: getting the target and the draft into the pod (PVC plan, Modelcar image, registry, credentials, air gap)."""
