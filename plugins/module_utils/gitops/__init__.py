"""gitops: who owns a serving object (Argo CD, Flux, Helm), the Git repository that holds its truth, and the owner's sync."""
