# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Verified, resumable copy of model artifacts into a directory (a PVC subdirectory).

Plain Python, standard library only, and no import of ``ansible_collections``: the stage_pvc role ships this
package (with ``errors.py``) as one zip application in a ConfigMap (``bundle.py``) and the Job runs it with the
vLLM runtime image's python3 (``python3 artifact_sync.pyz --config plan.json``; ``... remove --config plan.json``
removes a staged subdirectory). The files import each other relatively, so the same imports work inside the
collection (``pvc_plan``, ``air_gap`` and ``draft_removal`` plan with its sources and checks) and inside the zip.

The parts: ``common`` (constants, errors, small helpers), ``sources`` (where files come from), ``reads`` (how a
source is read into buffers), ``syncer`` (the copy engine), ``check`` (a staged directory against its
manifest), ``serve`` (the controller's file server), ``cli`` (the command line), ``remove`` (the draft remover).

What a run guarantees
- Every file is copied to ``<dest>/.spec-decoding-tmp/<path>.part``, hashed (sha256) while it is copied
  (one read into a private 256 KiB buffer, the hash of that buffer, the write of that same buffer: the
  bytes written are the bytes hashed), fsynced, journaled and renamed into place. Several files are
  copied at once (``--workers``); the fsyncs run on a flusher thread so the disk writes while the CPUs
  hash; memory stays bounded (a few buffers per worker, no memory maps of the files). Local files that
  are not in the page cache are read with O_DIRECT into those buffers (``--no-direct-io`` turns it off).
- ``<dest>/.spec-decoding-manifest.json`` (per-file size and sha256) is written last, after every file
  and directory is durable, and is removed first when a run is about to change anything: a directory
  with a manifest is always complete.
- A journal (``.spec-decoding-journal.json``) records finished files, so a rerun after a kill copies
  only what is missing; a partial file is resumed where it stopped (same node: everything written;
  after a reboot: up to the last fdatasync checkpoint).
- Files already present are skipped by a cheap size+mtime check against the manifest or journal, then
  re-hashed by the verify pass (``--verify auto``); a mismatch is recopied. ``--verify full`` re-hashes
  freshly copied files too, ``--verify quick`` trusts size+mtime.
- A directory holding another model (manifest ``name`` differs) or files this tool did not write is
  refused without ``--force``.

Sources: a local directory (``/path`` or ``file:///path``), an HTTP(S) mirror (``https://host/dir/``;
file list from the mirror's ``.spec-decoding-manifest.json``, a JSON ``--index-url``, or an HTML
directory listing), a Hugging Face compatible mirror (``hf://<repo>[@<revision>]`` with
``HF_ENDPOINT``), and S3-compatible buckets readable anonymously (``s3://bucket/prefix`` with
``--s3-endpoint``). ``--air-gapped`` refuses every public hub host, redirects included.

The last line on stdout is one JSON object ``{"spec_decoding_sync": {...}}`` summarising the run.
"""

from __future__ import annotations

from .check import check_dest
from .cli import build_parser, main, run_item
from .common import (DEFAULT_BUFFER, DEFAULT_CHECKPOINT, DEFAULT_HF_ENDPOINT, INTERNAL_NAMES, JOURNAL_NAME, MANIFEST_NAME, MANIFEST_SCHEMA,
                     PIPELINE_DEPTH, PUBLIC_HUB_HOSTS, RESULT_KEY, TMP_DIR, VERIFY_MODES, SourceFile, SpecDecodingError, SyncError,
                     ValidationError, __version__, atomic_write_json, boot_id, check_url_allowed, human_bytes, is_public_hub, read_json,
                     read_manifest, tree_digest)
from .common import DIRECT_ALIGN, DIRECT_BUFFER, DIRECT_DEPTH, DIRECT_MIN_BYTES
from .remove import remove_staged, remove_subdir_main
from .serve import serve
from .sources import HfSource, HttpClient, HttpSource, LocalSource, S3Source, make_source, select_files
from .syncer import Syncer
