# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The labels and annotations by which Argo CD, Flux and Helm mark the objects they manage (gitops/owner.py reads them to
find an object's owner; the sources of each are named there).

An object the collection derives from a managed one (the benchmark's baseline twin) must not carry them: Argo CD would
count it as part of the Application (and prune it), and the collection itself would take the copy for a managed object.
"""

from __future__ import annotations

ARGOCD_TRACKING_ANNOTATION = "argocd.argoproj.io/tracking-id"
ARGOCD_INSTANCE_LABEL = "app.kubernetes.io/instance"
ARGOCD_INSTALLATION_ANNOTATION = "argocd.argoproj.io/installation-id"
KUSTOMIZE_NAME_LABEL = "kustomize.toolkit.fluxcd.io/name"
KUSTOMIZE_NAMESPACE_LABEL = "kustomize.toolkit.fluxcd.io/namespace"
HELMRELEASE_NAME_LABEL = "helm.toolkit.fluxcd.io/name"
HELMRELEASE_NAMESPACE_LABEL = "helm.toolkit.fluxcd.io/namespace"
HELM_RELEASE_NAME_ANNOTATION = "meta.helm.sh/release-name"
HELM_RELEASE_NAMESPACE_ANNOTATION = "meta.helm.sh/release-namespace"
HELM_MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"

OWNER_ANNOTATIONS = (ARGOCD_TRACKING_ANNOTATION, ARGOCD_INSTALLATION_ANNOTATION, HELM_RELEASE_NAME_ANNOTATION,
                     HELM_RELEASE_NAMESPACE_ANNOTATION)
OWNER_LABELS = (ARGOCD_INSTANCE_LABEL, KUSTOMIZE_NAME_LABEL, KUSTOMIZE_NAMESPACE_LABEL, HELMRELEASE_NAME_LABEL,
                HELMRELEASE_NAMESPACE_LABEL, HELM_MANAGED_BY_LABEL)
