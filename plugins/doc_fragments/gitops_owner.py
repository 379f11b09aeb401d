# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    """Option gitops_owner of every module that writes a serving object live (isvc_speculative, llmisvc_speculative,
    canary_rollout, draft_artifacts). The argument spec is gitops/owner.py's GITOPS_OWNER_ARG_SPEC."""

    DOCUMENTATION = r"""
options:
  gitops_owner:
    description:
      - What to do when the object is managed by Argo CD (annotation C(argocd.argoproj.io/tracking-id), or label
        C(app.kubernetes.io/instance) with Argo CD's installation id or field manager), Flux (labels
        C(kustomize.toolkit.fluxcd.io/name), C(helm.toolkit.fluxcd.io/name)) or Helm (annotation C(meta.helm.sh/release-name)),
        or written by one of their field managers.
      - V(refuse) fails before any write, naming the owner, its sync policy and source (read from the Application,
        Kustomization or HelmRelease where RBAC allows, see C(docs/rbac/gitops-owner-reader.yaml)) and the fixes - the
        rollback role's C(rollback_mode=git) or C(rollback_mode=emergency). An automated owner would put the live change
        back at its next sync, after this task reported success.
      - V(ignore) writes anyway, with a warning naming the owner - only when the owner is gone or does not self-heal.
    type: str
    choices: [refuse, ignore]
    default: refuse
"""
