#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: modelcar_image
short_description: Build a KServe Modelcar OCI image (target + draft model) and push it, fast and air-gap friendly
version_added: "0.1.0"
description:
  - Builds an OCI image holding the target model under C(/models/target) and, optionally, the speculative-decoding
    draft under C(/models/draft), for an InferenceService C(storageUri) of the form C(oci://...) (KServe Modelcar).
  - The image meets KServe's Modelcar contract - non-empty C(/models), no Entrypoint/Cmd, C(PATH) set, and a base
    layer from Debian's C(busybox-static) (C(sh ln sleep mkdir ls [ echo cat)) so the sidecar command
    C(ln -sf /proc/$$/root/models /mnt/models && sleep infinity) and the init check that C(/models) is a
    non-empty directory (C([ -d /models ]) and C(ls -A /models)) run inside it.
  - Each model file becomes one uncompressed tar layer (mtime 0, uid/gid 0, parent directories included, a
    C(org.opencontainers.image.title) annotation naming the file), so digests are reproducible and an unchanged
    file reuses its blob. Layers are streamed and hashed while they are uploaded; a stat cache of digests makes an
    unchanged rerun read no file and upload nothing (C(changed=false)).
  - Pushes through the OCI distribution API with HEAD checks, streamed uploads, retries, Basic and Bearer-token auth.
    The manifest is written last, so the tag only ever points at a complete image; a push that dies midway is
    completed by the rerun. Talks to nothing but the given registry (and the token realm that registry names).
  - Can also write an OCI layout directory or an oci-archive (C(archive)) for carrying into an air-gapped site, and
    push such an archive later (C(from_archive)).
  - Ansible modules cannot stream output while they run, so progress (bytes, percent, MiB/s) is appended to
    C(progress_log) (follow it with C(tail -f)) and the lines are returned in C(progress).
author:
  - Alauda (@alauda)
extends_documentation_fragment:
  - alauda.spec_decoding.attributes.WRITES
  - alauda.spec_decoding.attributes.ACTION_GROUP
options:
  target_dir:
    description:
      - Directory with the target model files (config, tokenizer, safetensors). Placed under C(/models/<layout.target>).
      - Symlinks are followed only while they stay inside the directory, see O(follow_external_symlinks).
    type: path
  draft_dir:
    description: Directory with the draft model (for example an EAGLE-3 head). Placed under C(/models/<layout.draft>).
    type: path
  layout:
    description: Subdirectory names under C(/models).
    type: dict
    default: {}
    suboptions:
      target:
        description: Name of the target model directory under C(/models).
        type: str
        default: target
      draft:
        description: Name of the draft model directory under C(/models).
        type: str
        default: draft
  image:
    description:
      - Image reference C(registry[:port]/repository:tag) to push to. The registry part is required (no Docker Hub
        default). A leading C(oci://) is accepted.
      - Required unless only O(archive) is written.
    type: str
  base:
    description:
      - C(busybox) (default) builds the base layer from Debian's static busybox (package C(busybox-static) on the host
        running the module).
      - Otherwise an OCI layout directory or oci-archive, optionally with C(:NAME) to pick an image, for example
        C(/srv/images/ubi-minimal:9). Its Entrypoint/Cmd are removed (KServe runs its own C(sh -c) command).
    type: str
    default: busybox
  archive:
    description:
      - Also write the image to this path, as an oci-archive when it ends with C(.tar), else as an OCI layout directory.
        An existing archive of the same image is left alone.
    type: path
  from_archive:
    description:
      - Push an OCI layout directory or oci-archive written earlier (optionally C(PATH:NAME)) to O(image) instead of
        building from model directories. Mutually exclusive with O(target_dir).
    type: path
  username:
    description: Registry user (Basic auth, or the credentials sent to the token service for Bearer auth).
    type: str
  password:
    description: Registry password or robot token. Never logged or returned.
    type: str
  auth_file:
    description: Docker C(config.json) or containers C(auth.json) holding credentials for the registry.
    type: path
  tls_verify:
    description:
      - Verify the registry's TLS certificate. When false, a registry that only speaks plain HTTP is also accepted
        (like skopeo's C(--dest-tls-verify=false)).
    type: bool
    default: true
  ca_file:
    description: PEM file with the CA that signed the registry's certificate.
    type: path
  labels:
    description: Labels for the image config.
    type: dict
    default: {}
  annotations:
    description: Annotations for the image manifest.
    type: dict
    default: {}
  model_name:
    description: Target model name; recorded as label and annotation C(io.alauda.spec-decoding.model-name).
    type: str
  model_revision:
    description: Target model revision; recorded as label and annotation C(io.alauda.spec-decoding.model-revision).
    type: str
  draft_name:
    description: Draft model name; recorded as label and annotation C(io.alauda.spec-decoding.draft-name).
    type: str
  follow_external_symlinks:
    description:
      - A symlink pointing outside the model directory is refused by default (for example a Hugging Face cache
        snapshot). When true, the content of its target is copied into the image instead.
    type: bool
    default: false
  max_layers:
    description:
      - At most this many layers (base included). Beyond it, the smallest files share one layer, because container
        runtimes limit the number of layers (overlayfs, about 125).
    type: int
    default: 100
  jobs:
    description: Blobs uploaded in parallel.
    type: int
    default: 3
  retries:
    description: Attempts after the first for each request or blob upload (exponential backoff from 0.5 s).
    type: int
    default: 4
  timeout:
    description: Socket timeout in seconds for each registry operation.
    type: int
    default: 120
  cache_dir:
    description: Directory of the stat cache of layer digests.
    type: path
    default: ~/.cache/alauda-spec-decoding/modelcar
  progress_log:
    description: File to append progress lines to (about every 2 seconds while uploading).
    type: path
notes:
  - Runs on the host that has the model files (often the controller with C(delegate_to)); needs only Python's stdlib.
  - KServe runs the Modelcar sidecar as uid 1010 by default; files are stored world-readable (0644, directories 0755).
seealso:
  - name: KServe Modelcar
    description: Serving models from OCI images.
    link: https://kserve.github.io/website/latest/modelserving/storage/oci/
"""

EXAMPLES = r"""
- name: Build and push target + EAGLE-3 draft to the internal registry
  alauda.spec_decoding.modelcar_image:
    target_dir: /data/models/Llama-3.1-8B-Instruct
    draft_dir: /data/models/EAGLE3-LLaMA3.1-Instruct-8B
    image: registry.cluster.local:5000/models/llama31-eagle3:v1
    username: "{{ registry_user }}"
    password: "{{ registry_password }}"
    ca_file: /etc/pki/registry-ca.pem
    model_name: meta-llama/Llama-3.1-8B-Instruct
    draft_name: yuhuili/EAGLE3-LLaMA3.1-Instruct-8B
    progress_log: /tmp/modelcar-push.log
  register: modelcar

- name: Use the digest-pinned URI in the InferenceService
  ansible.builtin.debug:
    msg: "storageUri: {{ modelcar.storage_uri }}"

- name: Connected side - write an oci-archive to carry into the air-gapped site
  alauda.spec_decoding.modelcar_image:
    target_dir: /data/models/Llama-3.1-8B-Instruct
    draft_dir: /data/models/EAGLE3-LLaMA3.1-Instruct-8B
    archive: /media/usb/llama31-eagle3.tar

- name: Air-gapped side - push the carried archive
  alauda.spec_decoding.modelcar_image:
    from_archive: /media/usb/llama31-eagle3.tar
    image: registry.airgap.local/models/llama31-eagle3:v1
    auth_file: ~/.config/containers/auth.json
"""

RETURN = r"""
image:
  description: The image reference pushed (with tag), or null when only an archive was written.
  returned: always
  type: str
  sample: registry.local:5000/models/llama31-eagle3:v1
digest:
  description: Manifest digest (the same for the same files, base and labels).
  returned: always
  type: str
  sample: sha256:39ad39301d76995cab6e4e5ce432d3f1c2988118fc0e35f856d2467322b1bb56
storage_uri:
  description: Digest-pinned C(oci://) URI for the InferenceService's C(storageUri), or null without O(image).
  returned: always
  type: str
  sample: oci://registry.local:5000/models/llama31-eagle3@sha256:39ad39301d76995cab6e4e5ce432d3f1c2988118fc0e35f856d2467322b1bb56
layers_pushed:
  description: Blobs uploaded (in check mode, blobs that would be uploaded).
  returned: always
  type: int
layers_skipped:
  description: Layers already in the registry (not uploaded).
  returned: always
  type: int
bytes_pushed:
  description: Bytes uploaded (in check mode, bytes that would be uploaded). 0 when nothing changed.
  returned: always
  type: int
bytes_hashed:
  description: Bytes read only to compute digests (files the stat cache did not know).
  returned: always
  type: int
archive:
  description: Path of the OCI layout or oci-archive written, or null.
  returned: always
  type: str
archive_bytes_written:
  description: Bytes written to O(archive) (0 when it was already up to date).
  returned: always
  type: int
layers:
  description: Each layer's title (file path in the image), digest and size.
  returned: always
  type: list
  elements: dict
seconds:
  description: Wall time of the push.
  returned: always
  type: float
rate_mib_s:
  description: Upload rate over the push, MiB/s.
  returned: always
  type: float
progress:
  description: The progress lines (also appended to O(progress_log) while running).
  returned: always
  type: list
  elements: str
"""


from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import modelcar_push
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import ModuleContract


def argument_spec():
    return dict(
        target_dir=dict(type="path"),
        draft_dir=dict(type="path"),
        layout=dict(type="dict", default={}, options=dict(target=dict(type="str", default="target"), draft=dict(type="str", default="draft"))),
        image=dict(type="str"),
        base=dict(type="str", default="busybox"),
        archive=dict(type="path"),
        from_archive=dict(type="path"),
        username=dict(type="str"),
        password=dict(type="str", no_log=True),
        auth_file=dict(type="path"),
        tls_verify=dict(type="bool", default=True),
        ca_file=dict(type="path"),
        labels=dict(type="dict", default={}),
        annotations=dict(type="dict", default={}),
        model_name=dict(type="str"),
        model_revision=dict(type="str"),
        draft_name=dict(type="str"),
        follow_external_symlinks=dict(type="bool", default=False),
        max_layers=dict(type="int", default=100),
        jobs=dict(type="int", default=modelcar_push.MODELCAR_DEFAULTS["jobs"]),
        retries=dict(type="int", default=modelcar_push.MODELCAR_DEFAULTS["retries"]),
        timeout=dict(type="int", default=modelcar_push.MODELCAR_DEFAULTS["timeout"]),
        cache_dir=dict(type="path", default="~/.cache/alauda-spec-decoding/modelcar"),
        progress_log=dict(type="path"),
    )


def execute(module):
    # A password read from auth_file stays out of every output too.
    return modelcar_push.build_modelcar(module.params, check_mode=module.check_mode, diff=module._diff,  # pylint: disable=protected-access
                                        warn=module.warn, hide=module.no_log_values.add)


CONTRACT = ModuleContract(
    argument_spec, execute,
    constraints=dict(
        required_one_of=[("target_dir", "from_archive")],
        mutually_exclusive=[("target_dir", "from_archive"), ("draft_dir", "from_archive"), ("auth_file", "username"), ("auth_file", "password")],
        required_together=[("username", "password")],
    ),
    cluster=False,
)


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
