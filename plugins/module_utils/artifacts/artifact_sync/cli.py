# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The stager's command line: stage (``--config plan.json`` or ``--source/--dest``), ``--plan``, ``--check``, ``--serve``.

The last line on stdout is one JSON object ``{"spec_decoding_sync": {...}}`` summarising the run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .common import (DEFAULT_BUFFER, DEFAULT_CHECKPOINT, PIPELINE_DEPTH, RESULT_KEY, VERIFY_MODES, SpecDecodingError, ValidationError, emit,
                     human_bytes, read_json)
from .serve import serve
from .sources import make_source
from .check import check_dest
from .syncer import Syncer


def _truthy(value):
    return str(value or "").strip().lower() in ("1", "true", "yes", "on")


def build_parser():
    parser = argparse.ArgumentParser(
        prog="artifact_sync.pyz",
        description="Copy model files into a directory with a sha256 manifest written last; resumable and verified.")
    parser.add_argument("--source", help="directory, file://, http(s)://mirror/dir/, hf://<repo>[@rev] or s3://bucket/prefix")
    parser.add_argument("--dest", help="destination directory (e.g. /mnt/pvc/Meta-Llama-3.1-8B-Instruct)")
    parser.add_argument("--name", help="model identity recorded in the manifest (default: derived from the source)")
    parser.add_argument("--revision", help="hub revision for hf:// sources (default main)")
    parser.add_argument("--include", action="append", default=[], help="glob of files to copy (repeatable)")
    parser.add_argument("--exclude", action="append", default=[], help="glob of files to skip (repeatable)")
    parser.add_argument("--config", help="JSON file with {'items': [{source, dest, name, ...}], ...} to stage several models")
    parser.add_argument("--air-gapped", action="store_true", default=_truthy(os.environ.get("SPEC_DECODING_AIR_GAPPED")),
                        help="refuse public hub hosts (default from SPEC_DECODING_AIR_GAPPED)")
    parser.add_argument("--hf-endpoint", help="Hugging Face mirror (default HF_ENDPOINT, else huggingface.co)")
    parser.add_argument("--s3-endpoint", help="S3-compatible endpoint for s3:// sources")
    parser.add_argument("--index-url", help="JSON file list for an http(s) mirror")
    parser.add_argument("--insecure", action="store_true", help="skip TLS verification of the mirror")
    parser.add_argument("--ca-bundle", help="CA bundle for the mirror's TLS certificate")
    parser.add_argument("--force", action="store_true", help="replace a different model or foreign files in dest")
    parser.add_argument("--verify", choices=VERIFY_MODES, default="auto",
                        help="auto: re-hash files skipped by the size+mtime check; full: re-hash everything; quick: trust size+mtime")
    parser.add_argument("--workers", type=int, default=None, help="files copied in parallel (default min(4, CPUs))")
    parser.add_argument("--buffer-size", type=int, default=DEFAULT_BUFFER, help="copy buffer in bytes")
    parser.add_argument("--read-ahead", type=int, default=None,
                        help="buffers a reader thread fills ahead of hashing and writing, per file (0: read in the copying thread; "
                        "default %d for network sources, 0 for local files, where the kernel's readahead already overlaps)" % PIPELINE_DEPTH)
    parser.add_argument("--no-direct-io", action="store_true",
                        help="read local files through the page cache even when they are not in it (default: O_DIRECT for those)")
    parser.add_argument("--checkpoint-bytes", type=int, default=DEFAULT_CHECKPOINT, help="fdatasync + resume checkpoint interval")
    parser.add_argument("--max-rate", type=float, default=0, help="cap the copy rate in MiB/s (0: no cap), e.g. to spare shared storage")
    parser.add_argument("--no-fsync", action="store_true", help="skip fsync (benchmarks only: a crash can lose data)")
    parser.add_argument("--plan", action="store_true", help="list the source (files, total size) and exit")
    parser.add_argument("--check", action="store_true", help="verify --dest (or each config item) against its manifest and exit")
    parser.add_argument("--no-rehash", action="store_true", help="with --check: sizes only")
    parser.add_argument("--serve", metavar="DIR", help="serve DIR over HTTP for a stager to pull (with --bind/--port)")
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--idle-exit", type=float, default=0, help="with --serve: stop after this many idle seconds")
    parser.add_argument("--ready-file", help="with --serve: write the URL to this file once the port is bound")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return parser


def _items_from_args(args):
    if args.config:
        data = read_json(args.config)
        if not isinstance(data, dict) or not isinstance(data.get("items"), list) or not data["items"]:
            raise ValidationError("%s is not a JSON object with a non-empty 'items' list" % args.config, field="config")
        defaults = {k: v for k, v in data.items() if k != "items"}
        return [dict(defaults, **item) for item in data["items"]]
    if not args.dest or (not args.source and not args.check):
        raise ValidationError("--source and --dest are required (or --config)", field="source")
    return [{"source": args.source, "dest": args.dest, "name": args.name, "revision": args.revision, "include": args.include,
             "exclude": args.exclude}]


def run_item(item, args, log):
    """Stage one item (a dict with source, dest and optional settings); returns its summary."""
    air_gapped = bool(item.get("air_gapped", False)) or args.air_gapped
    source = make_source(
        item.get("source"), air_gapped=air_gapped, hf_endpoint=item.get("hf_endpoint") or args.hf_endpoint,
        revision=item.get("revision"), s3_endpoint=item.get("s3_endpoint") or args.s3_endpoint,
        index_url=item.get("index_url") or args.index_url, token=os.environ.get(item.get("token_env") or "HF_TOKEN"),
        insecure=bool(item.get("insecure")) or args.insecure, ca_bundle=item.get("ca_bundle") or args.ca_bundle)
    syncer = Syncer(source, item["dest"], name=item.get("name"), include=item.get("include"), exclude=item.get("exclude"),
                    force=bool(item.get("force")) or args.force, verify=item.get("verify") or args.verify,
                    workers=item.get("workers") or args.workers, buffer_size=args.buffer_size, fsync=not args.no_fsync,
                    checkpoint_bytes=args.checkpoint_bytes, log=log, max_rate=(item.get("max_rate_mib_s") or args.max_rate) * 1048576,
                    read_ahead=args.read_ahead, direct_io=not args.no_direct_io)
    if args.plan:
        files = syncer.listing()
        return {"ok": True, "name": syncer.name, "source": source.uri, "dest": syncer.dest, "files": len(files),
                "bytes": sum(f.size or 0 for f in files), "listing": [f.as_dict() for f in files]}
    return syncer.run()


def failed_item(exc):
    """(exit code, result item) of an error that ends a CLI run: 2 for bad input, 1 for anything else."""
    if isinstance(exc, ValidationError):
        return 2, {"ok": False, "error": str(exc), "field": exc.field, "kind": "validation"}
    if isinstance(exc, SpecDecodingError):
        return 1, {"ok": False, "error": str(exc), "field": exc.field, "kind": "sync"}
    return 1, {"ok": False, "error": "%s: %s" % (getattr(exc, "filename", "") or "", exc.strerror or exc), "kind": "os"}


def main(argv=None):
    """CLI entry point; returns the exit code (0 ok, 2 bad input, 1 failure)."""
    args = build_parser().parse_args(argv)
    log = None if args.quiet else sys.stderr
    if args.serve:
        try:
            serve(args.serve, args.bind, args.port, idle_exit=args.idle_exit, ready_file=args.ready_file)
        except OSError as exc:
            emit(sys.stderr, "[artifact-sync] ERROR: cannot serve %s on %s:%d: %s" % (args.serve, args.bind, args.port, exc.strerror or exc))
            return 1
        return 0
    results = []
    code = 0
    try:
        items = _items_from_args(args)
        for item in items:
            if args.check:
                results.append(check_dest(item["dest"], name=item.get("name"), rehash=not args.no_rehash, workers=args.workers))
            else:
                results.append(run_item(item, args, log))
                if not args.plan:
                    # The layout check the role reads from this line: the manifest is complete and every file is there.
                    results[-1]["verified_layout"] = bool(check_dest(item["dest"], name=results[-1]["name"], rehash=False)["ok"])
                if log is not None and not args.plan:
                    r = results[-1]
                    emit(log, "[artifact-sync] %s: done, %d file(s) %s, copied %d (%s), skipped %d, verified %d, %.1f s" % (
                        r["dest"], r["files"], human_bytes(r["bytes"]), r.get("copied_files", 0), human_bytes(r.get("copied_bytes", 0)),
                        r.get("skipped_files", 0), r.get("verified_files", 0), r.get("seconds", 0)))
    except (SpecDecodingError, OSError) as exc:
        code, item = failed_item(exc)
        results.append(item)
    if code and log is not None:
        emit(log, "[artifact-sync] ERROR: %s" % results[-1]["error"])
    summary = {"ok": code == 0, "mode": "check" if args.check else ("plan" if args.plan else "sync"), "items": results}
    root = (read_json(args.config) or {}).get("root") if args.config else None
    if root and os.path.isdir(root):
        summary["layout"] = sorted(n for n in os.listdir(root) if not n.startswith("."))
    emit(sys.stdout, json.dumps({RESULT_KEY: summary}, sort_keys=True))
    return code
