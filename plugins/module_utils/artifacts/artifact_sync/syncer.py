# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The copy engine: one source listing into one destination directory, journaled, resumable, verified."""

from __future__ import annotations

import concurrent.futures
import errno
import hashlib
import os
import shutil
import threading
import time

from .common import (DEFAULT_BUFFER, DEFAULT_CHECKPOINT, INTERNAL_NAMES, JOURNAL_NAME, MANIFEST_NAME, MANIFEST_SCHEMA, PIPELINE_DEPTH,
                     TMP_DIR, VERIFY_MODES, WRITEBACK_WINDOW, SyncError, ValidationError, __version__, atomic_write_json, boot_id, emit,
                     fsync_dir, human_bytes, peak_rss_mib, read_json, read_manifest, tree_digest)
from .reads import _INLINE, ChunkReader, _advise
from .sources import LocalSource, select_files


class _Progress:
    """Thread-safe byte counter with a periodic stderr line."""

    def __init__(self, total, label, interval=5.0, stream=None):
        self.total = total
        self.label = label
        self.interval = interval
        self.stream = stream
        self.lock = threading.Lock()
        self.done = 0
        self.start = time.monotonic()
        self.last = self.start

    def add(self, num):
        with self.lock:
            self.done += num
            now = time.monotonic()
            if self.stream is not None and now - self.last >= self.interval:
                self.last = now
                rate = self.done / max(now - self.start, 1e-6)
                emit(self.stream, "%s: %s / %s (%.0f MiB/s)" % (self.label, human_bytes(self.done), human_bytes(self.total), rate / 1048576))


class Syncer(ChunkReader):  # pylint: disable=too-many-instance-attributes
    """Copy one source listing into one destination directory."""

    def __init__(self, source, dest, name=None, include=None, exclude=None, force=False, verify="auto", workers=None,
                 buffer_size=DEFAULT_BUFFER, fsync=True, checkpoint_bytes=DEFAULT_CHECKPOINT, log=None, max_rate=0,
                 read_ahead=None, direct_io=True):
        if verify not in VERIFY_MODES:
            raise ValidationError("unknown verify mode %r" % verify, field="verify", hint="use one of %s" % ", ".join(VERIFY_MODES))
        self.source = source
        self.dest = os.path.abspath(dest)
        self.name = name or source.default_name()
        self.include = list(include or [])
        self.exclude = list(exclude or [])
        self.force = force
        self.verify = verify
        self.workers = max(1, int(workers or min(4, os.cpu_count() or 1)))
        self.buffer_size = max(64 * 1024, int(buffer_size))
        if read_ahead is None:
            # Local files: the kernel reads ahead asynchronously already, a thread would only add hand-offs.
            read_ahead = 0 if isinstance(source, LocalSource) else PIPELINE_DEPTH
        self.read_ahead = max(0, int(read_ahead))
        self.direct_io = bool(direct_io)
        self._flusher = None
        self.fsync = fsync
        self.checkpoint_bytes = max(self.buffer_size, int(checkpoint_bytes))
        self.log = log
        self.tmp_root = os.path.join(self.dest, TMP_DIR)
        self.manifest_path = os.path.join(self.dest, MANIFEST_NAME)
        self.journal_path = os.path.join(self.dest, JOURNAL_NAME)
        self.journal_lock = threading.Lock()
        self.journal = None
        self.journal_written = 0.0
        self.boot = boot_id()
        self.stats = {"copied_files": 0, "copied_bytes": 0, "resumed_bytes": 0, "skipped_files": 0, "verified_files": 0,
                      "verified_bytes": 0, "direct_read_bytes": 0}
        self.stats_lock = threading.Lock()
        self.recopied = []
        self.deleted = []
        self.progress = None
        self.max_rate = float(max_rate or 0)
        self.rate_lock = threading.Lock()
        self.rate_bytes = 0
        self.rate_start = None

    # -- logging ---------------------------------------------------------------------------------
    def _log(self, msg):
        if self.log is not None:
            emit(self.log, "[artifact-sync] %s" % msg)

    def _count(self, **kw):
        with self.stats_lock:
            for key, value in kw.items():
                self.stats[key] += value

    # -- planning --------------------------------------------------------------------------------
    def listing(self):
        files = select_files(self.source.list_files(), self.include, self.exclude)
        if not files:
            raise ValidationError("the source %s has no files to stage (after include/exclude filters)" % self.source.uri, field="source",
                                  hint="check the source path and the include/exclude patterns")
        return files

    def _dest_entries(self):
        """Relative paths of regular files under dest (internal names excluded)."""
        out = []
        if not os.path.isdir(self.dest):
            return out
        for dirpath, dirnames, filenames in os.walk(self.dest):
            rel_dir = os.path.relpath(dirpath, self.dest)
            if rel_dir == ".":
                dirnames[:] = [d for d in dirnames if d not in INTERNAL_NAMES]
                filenames = [f for f in filenames if f not in INTERNAL_NAMES and not f.startswith(JOURNAL_NAME) and not f.startswith(MANIFEST_NAME)]
            for name in filenames:
                out.append(name if rel_dir == "." else "%s/%s" % (rel_dir.replace(os.sep, "/"), name))
        return sorted(out)

    def check_ownership(self, manifest, journal):
        """Refuse a directory that holds another model, or files we did not write, unless forced."""
        owner = None
        for doc in (journal, manifest):
            if doc and doc.get("name"):
                owner = doc["name"]
                break
        if owner is not None and owner != self.name and not self.force:
            raise ValidationError(
                "%s holds the model %r, not %r" % (self.dest, owner, self.name),
                field="dest",
                hint="stage into another subdirectory, or pass --force (stage_pvc_force: true) to replace it",
            )
        if owner is None and not self.force:
            foreign = self._dest_entries()
            if foreign:
                raise ValidationError(
                    "%s already holds %d file(s) this tool did not write (e.g. %s)" % (self.dest, len(foreign), foreign[0]),
                    field="dest",
                    hint="stage into an empty subdirectory, or pass --force (stage_pvc_force: true) to replace its content",
                )
        return owner

    def check_space(self, needed):
        """Fail early when the file system cannot hold what is still to be copied."""
        try:
            st = os.statvfs(self.dest)
        except OSError:
            return
        free = st.f_bavail * st.f_frsize
        if needed > free:
            raise ValidationError(
                "%s needs %s more but only %s is free" % (self.dest, human_bytes(needed), human_bytes(free)),
                field="dest",
                hint="use a larger volume (stage_pvc_size / stage_pvc_headroom_percent) or free space",
            )

    # -- journal ---------------------------------------------------------------------------------
    def _write_journal(self, force=False):
        with self.journal_lock:
            now = time.monotonic()
            if not force and now - self.journal_written < 1.0:
                return
            atomic_write_json(self.journal_path, self.journal, fsync=self.fsync)
            self.journal_written = now

    def _record(self, entry, sha, st):
        with self.journal_lock:
            self.journal["files"][entry.path] = {"size": st.st_size, "sha256": sha, "mtime_ns": st.st_mtime_ns, "source": entry.fingerprint}
        # Every finished file is journaled at once (a few hundred microseconds), so a kill right after it never
        # makes the rerun copy it again.
        self._write_journal(force=True)

    # -- copy ------------------------------------------------------------------------------------
    def _tmp_paths(self, rel):
        tmp = os.path.join(self.tmp_root, rel.replace("/", os.sep) + ".part")
        return tmp, tmp + ".ckpt"

    def _resume_offset(self, entry, tmp, ckpt):
        """How many bytes of a previous partial copy can be trusted."""
        state = read_json(ckpt)
        if not isinstance(state, dict) or state.get("source") != entry.fingerprint:
            return 0
        try:
            size = os.stat(tmp).st_size
        except OSError:
            return 0
        trusted = size if (state.get("boot_id") and state.get("boot_id") == self.boot) else int(state.get("synced", 0))
        trusted = min(trusted, size)
        if entry.size is not None:
            trusted = min(trusted, entry.size)
        return max(0, trusted)

    def _hash_prefix(self, tmp, offset, hasher):
        """Feed the first ``offset`` bytes of a partial file to ``hasher`` as they are on disk now, so the final
        hash covers exactly the bytes the file holds; False when the file is shorter than that."""
        view = memoryview(bytearray(self.buffer_size))
        left = offset
        with open(tmp, "rb", buffering=0) as prefix:
            while left:
                num = prefix.readinto(view[: min(len(view), left)])
                if not num:
                    return False
                hasher.update(view[:num])
                left -= num
        return True

    @classmethod
    def _open_part(cls, tmp, offset):
        """The partial file, positioned at ``offset`` and holding exactly that many bytes.

        Starting over means a new file, never a truncation to zero: ext4 (auto_da_alloc) flushes a file that
        was truncated to zero when it is closed, synchronously in close(), which cost a third of a second per
        shard and left the disk idle meanwhile.
        """
        if not offset:
            cls._discard(tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size != offset:
                os.ftruncate(fd, offset)
            os.lseek(fd, offset, os.SEEK_SET)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def copy_file(self, entry, attempt=0):
        """Copy one file (resuming a partial copy); return its manifest entry, or a Future of it with fsync.

        Durability never blocks the copying thread: with fsync, the writeback kicks, the fdatasync
        checkpoints and the final fsync + journal + rename of each file run in order on one flusher
        thread (``self._flusher``) through a duplicate of the file descriptor, while this thread goes on
        reading, hashing and writing. The manifest is written only after every flush has finished.
        """
        tmp, ckpt = self._tmp_paths(entry.path)
        os.makedirs(os.path.dirname(tmp), exist_ok=True)
        offset = self._resume_offset(entry, tmp, ckpt) if attempt == 0 else 0
        hasher = hashlib.sha256()
        if offset and not self._hash_prefix(tmp, offset, hasher):
            offset, hasher = 0, hashlib.sha256()
        src, offset_ok = self.source.open(entry, offset)
        if offset_ok != offset:
            offset, hasher = 0, hashlib.sha256()
        try:
            fd = self._open_part(tmp, offset)
        except BaseException:
            src.close()
            raise
        flusher = (self._flusher or _INLINE) if self.fsync else None
        sync_fd = os.dup(fd) if flusher is not None else -1
        try:
            if offset:
                self._count(resumed_bytes=offset)
                self._log("resuming %s at %s" % (entry.path, human_bytes(offset)))
            atomic_write_json(ckpt, {"source": entry.fingerprint, "boot_id": self.boot, "synced": offset}, fsync=False)
            # No posix_fallocate: it would extend the file size, which is what resume trusts on the same boot.
            written = offset
            next_ckpt = offset + self.checkpoint_bytes
            flushed = offset
            with src:
                chunks = self._chunks(src)
                try:
                    for chunk in chunks:
                        # Hash, then write the very same private buffer: the bytes written are the bytes hashed.
                        hasher.update(chunk)
                        n = len(chunk)
                        try:
                            w = os.write(fd, chunk)
                            while w < n:
                                w += os.write(fd, chunk[w:])
                        except OSError as exc:
                            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                                raise SyncError("no space left while writing %s (%s)" % (entry.path, human_bytes(entry.size or written)),
                                                field="dest", hint="use a larger volume (stage_pvc_size / stage_pvc_headroom_percent)") from exc
                            raise
                        written += n
                        if self.progress is not None:
                            self.progress.add(n)
                        if self.max_rate:
                            self._throttle(n)
                        if flusher is not None and written - flushed >= WRITEBACK_WINDOW:
                            # Start writeback of what was just written (Linux: FADV_DONTNEED on dirty pages issues
                            # asynchronous writeback), so the disk is busy from the start and the final fsync is short.
                            flusher.submit(_advise, sync_fd, "POSIX_FADV_DONTNEED", flushed, written - flushed)
                            flushed = written
                        if flusher is not None and written >= next_ckpt:
                            flusher.submit(self._checkpoint, sync_fd, tmp, ckpt, entry, written)
                            next_ckpt = written + self.checkpoint_bytes
                finally:
                    chunks.close()  # joins a reader thread before the source is closed
            if os.fstat(fd).st_size != written:  # not expected (sequential writes from offset); never a truncation to zero
                os.ftruncate(fd, written)
            if entry.size is not None and written != entry.size:
                raise SyncError("%s: got %d bytes, expected %d" % (entry.path, written, entry.size), field="source",
                                hint="the source changed or the transfer was cut; rerun to resume")
            sha = hasher.hexdigest()
            if entry.sha256 and sha != entry.sha256:
                self._discard(tmp, ckpt)
                if attempt == 0:
                    self._log("%s: sha256 mismatch (%s != %s), copying it again" % (entry.path, sha, entry.sha256))
                    return self.copy_file(entry, attempt=1)
                raise SyncError("%s: sha256 %s does not match the source's %s" % (entry.path, sha, entry.sha256), field="source",
                                hint="the mirror serves different bytes than its index says; fix the mirror")
            done = (entry, sha, tmp, ckpt, written - offset)
            if flusher is not None:
                result = flusher.submit(self._finish, sync_fd, *done)
                sync_fd = -1  # _finish closes it
                return result
            return self._finish(-1, *done)
        finally:
            src.close()  # already closed when the copy got that far
            os.close(fd)
            if sync_fd >= 0:
                flusher.submit(os.close, sync_fd)  # after the flushes already queued for it

    def _checkpoint(self, sync_fd, tmp, ckpt, entry, written):
        """Flusher: make the first ``written`` bytes durable and record it, so a resume after a reboot trusts them."""
        try:
            os.fdatasync(sync_fd)
            if os.fstat(sync_fd).st_ino != os.stat(tmp).st_ino:
                return  # the partial file was discarded and started again meanwhile: this offset is not its own
        except OSError:
            return  # the final fsync reports the error
        atomic_write_json(ckpt, {"source": entry.fingerprint, "boot_id": self.boot, "synced": written}, fsync=False)

    def _finish(self, sync_fd, entry, sha, tmp, ckpt, copied):
        """fsync (when ``sync_fd`` is given), journal, move into place; return the manifest entry."""
        if sync_fd >= 0:
            try:
                os.fsync(sync_fd)
            finally:
                os.close(sync_fd)
        # Journal the file before it moves into place (a rename keeps size and mtime): a kill after the rename
        # can never leave a finished file the rerun does not know. A kill between the two leaves the complete
        # .part file, which the rerun resumes at its full length (nothing copied) and renames.
        st = os.stat(tmp)
        self._record(entry, sha, st)
        final = os.path.join(self.dest, entry.path.replace("/", os.sep))
        os.makedirs(os.path.dirname(final), exist_ok=True)
        if os.path.isdir(final) and not os.path.islink(final):
            shutil.rmtree(final)
        os.replace(tmp, final)
        self._discard(ckpt)
        self._count(copied_files=1, copied_bytes=copied)
        return {"size": st.st_size, "sha256": sha, "mtime_ns": st.st_mtime_ns, "source": entry.fingerprint}

    def _throttle(self, num):
        """Keep the total copy rate under ``max_rate`` bytes/s (shared by all workers)."""
        with self.rate_lock:
            now = time.monotonic()
            if self.rate_start is None:
                self.rate_start = now
            self.rate_bytes += num
            delay = self.rate_start + self.rate_bytes / self.max_rate - now
        if delay > 0:
            time.sleep(delay)

    @staticmethod
    def _discard(*paths):
        for path in paths:
            try:
                os.unlink(path)
            except OSError:
                pass

    def _orphan_temp_files(self):
        """Temp files of journal/manifest writes by runs that were killed (``<name>.tmp.<pid>``, that pid gone)."""
        found = []
        try:
            names = os.listdir(self.dest)
        except OSError:
            return found
        for fname in names:
            base, sep, pid = fname.rpartition(".tmp.")
            if not sep or base not in (JOURNAL_NAME, MANIFEST_NAME) or not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                os.kill(int(pid), 0)
                continue  # a live process of that pid may be writing it
            except ProcessLookupError:
                found.append(os.path.join(self.dest, fname))
            except OSError:
                continue
        return found

    def hash_file(self, rel):
        """sha256 of a destination file."""
        hasher = hashlib.sha256()
        total = 0
        with open(os.path.join(self.dest, rel.replace("/", os.sep)), "rb", buffering=0) as fh:
            _advise(fh.fileno(), "POSIX_FADV_SEQUENTIAL")
            chunks = self._chunks(fh)
            try:
                for chunk in chunks:
                    hasher.update(chunk)
                    total += len(chunk)
            finally:
                chunks.close()
        self._count(verified_files=1, verified_bytes=total)
        return hasher.hexdigest()

    def _parallel(self, func, items):
        if not items:
            return []
        if self.workers == 1 or len(items) == 1:
            return [func(item) for item in items]
        with concurrent.futures.ThreadPoolExecutor(max_workers=self.workers) as pool:
            return list(pool.map(func, items))

    # -- the run ---------------------------------------------------------------------------------
    def run(self, files=None):  # pylint: disable=too-many-locals,too-many-branches,too-many-statements
        start = time.monotonic()
        files = files if files is not None else self.listing()
        by_path = {f.path: f for f in files}
        if len(by_path) != len(files):
            raise ValidationError("the source lists a file twice", field="source")
        if os.path.exists(self.dest) and not os.path.isdir(self.dest):
            raise ValidationError("%s exists and is not a directory" % self.dest, field="dest")
        os.makedirs(self.dest, exist_ok=True)
        manifest = read_manifest(self.dest)
        journal = read_json(self.journal_path)
        if not (isinstance(journal, dict) and isinstance(journal.get("files"), dict)):
            journal = None
        owner = self.check_ownership(manifest, journal)
        same_owner = owner == self.name
        known = {}
        if same_owner:
            if manifest:
                known.update(manifest["files"])
            if journal and journal.get("name") == self.name:
                known.update(journal["files"])

        keep, to_copy = {}, []
        for entry in files:
            rec = known.get(entry.path)
            path = os.path.join(self.dest, entry.path.replace("/", os.sep))
            try:
                st = os.stat(path)
            except OSError:
                st = None
            if (rec and st is not None and st.st_size == rec.get("size") == entry.size and st.st_mtime_ns == rec.get("mtime_ns")
                    and (rec.get("source") == entry.fingerprint or (entry.sha256 and entry.sha256 == rec.get("sha256")))):
                keep[entry.path] = dict(rec)
            else:
                to_copy.append(entry)
        stale = [p for p in self._dest_entries() if p not in by_path and (p in known or self.force or not same_owner)]
        needed = sum(e.size or 0 for e in to_copy)
        self.check_space(needed)
        changing = bool(to_copy or stale)
        self._log("%s: %d file(s), %s; %d to copy (%s), %d present, %d stale" % (
            self.dest, len(files), human_bytes(sum(f.size or 0 for f in files)), len(to_copy), human_bytes(needed), len(keep), len(stale)))

        self.journal = {"schema": MANIFEST_SCHEMA, "name": self.name, "source": self.source.uri, "files": dict(keep)}

        def invalidate():
            """Before touching data: record ownership in the journal, then drop the manifest (fsynced).

            In this order a kill at any point leaves either the old (still true) manifest or the journal, so the
            rerun always recognises the directory as its own (the other order left neither: "files this tool did
            not write")."""
            self._write_journal(force=True)
            if os.path.exists(self.manifest_path):
                os.unlink(self.manifest_path)
                if self.fsync:
                    fsync_dir(self.dest)

        if changing:
            invalidate()
            for rel in stale:
                path = os.path.join(self.dest, rel.replace("/", os.sep))
                try:
                    os.unlink(path)
                except IsADirectoryError:
                    shutil.rmtree(path)
                except FileNotFoundError:
                    pass
                self.deleted.append(rel)
            self._copy_all(to_copy, keep)

        # Verify: re-hash what was skipped (auto) or everything (full); recopy mismatches.
        if self.verify != "quick":
            fresh = {e.path for e in to_copy}
            check = [p for p in sorted(keep) if self.verify == "full" or p not in fresh]
            hashes = self._parallel(self.hash_file, check)
            bad = [p for p, h in zip(check, hashes) if h != keep[p].get("sha256") or (by_path[p].sha256 and h != by_path[p].sha256)]
            if bad:
                self._log("verify: %d file(s) differ from the manifest, copying them again: %s" % (len(bad), ", ".join(bad)))
                if not changing:
                    invalidate()
                    changing = True
                self.recopied.extend(bad)
                for p in bad:
                    keep.pop(p, None)
                    with self.journal_lock:
                        self.journal["files"].pop(p, None)
                self._copy_all([by_path[p] for p in bad], keep)
                if self.verify == "full":
                    again = self._parallel(self.hash_file, bad)
                    still = [p for p, h in zip(bad, again) if h != keep[p]["sha256"]]
                    if still:
                        raise SyncError("files still differ after recopying: %s" % ", ".join(still), field="dest",
                                        hint="the volume corrupts data; check the storage")
        self._count(skipped_files=len(files) - len(to_copy))

        # Final check: everything listed is present with the right size.
        for entry in files:
            rec = keep.get(entry.path)
            path = os.path.join(self.dest, entry.path.replace("/", os.sep))
            try:
                st = os.stat(path)
            except OSError as exc:
                raise SyncError("%s is missing after the copy" % entry.path, field="dest") from exc
            if rec is None or st.st_size != rec["size"] or (entry.size is not None and st.st_size != entry.size):
                raise SyncError("%s has the wrong size after the copy" % entry.path, field="dest")

        manifest_files = {p: {"size": keep[p]["size"], "sha256": keep[p]["sha256"], "mtime_ns": keep[p]["mtime_ns"],
                              "source": keep[p]["source"]} for p in sorted(keep)}
        digest = tree_digest(manifest_files)
        if changing or manifest is None or manifest.get("tree_sha256") != digest or manifest.get("files") != manifest_files:
            if self.fsync:
                dirs = {os.path.dirname(os.path.join(self.dest, p.replace("/", os.sep))) for p in keep}
                for d in sorted(dirs, key=len, reverse=True):
                    fsync_dir(d)
            doc = {
                "schema": MANIFEST_SCHEMA,
                "name": self.name,
                "source": self.source.uri,
                "tool_version": __version__,
                "completed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "total_bytes": sum(f["size"] for f in manifest_files.values()),
                "file_count": len(manifest_files),
                "tree_sha256": digest,
                "files": manifest_files,
            }
            atomic_write_json(self.manifest_path, doc, fsync=self.fsync)
            if self.fsync:
                fsync_dir(self.dest)
            changed_manifest = True
        else:
            changed_manifest = False
        self._discard(self.journal_path, *self._orphan_temp_files())
        if os.path.isdir(self.tmp_root):
            shutil.rmtree(self.tmp_root, ignore_errors=True)
        seconds = time.monotonic() - start
        return {
            "ok": True,
            "name": self.name,
            "source": self.source.uri,
            "dest": self.dest,
            "changed": bool(changing or changed_manifest),
            "files": len(files),
            "bytes": sum(f["size"] for f in manifest_files.values()),
            "tree_sha256": digest,
            "manifest": self.manifest_path,
            "recopied": sorted(set(self.recopied)),
            "deleted": sorted(self.deleted),
            "seconds": round(seconds, 3),
            "peak_rss_mib": peak_rss_mib(),
            "copy_mib_s": round(self.stats["copied_bytes"] / 1048576 / seconds, 1) if seconds > 0 else 0.0,
            **self.stats,
        }

    def _copy_all(self, entries, keep):
        if not entries:
            return
        entries = sorted(entries, key=lambda e: -(e.size or 0))
        self.progress = _Progress(sum(e.size or 0 for e in entries), "copy %s" % self.name, stream=self.log)
        self._flusher = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="artifact-sync-flush") if self.fsync else None
        try:
            results = self._parallel(self.copy_file, entries)
            results = [r.result() if isinstance(r, concurrent.futures.Future) else r for r in results]
        finally:
            if self._flusher is not None:
                self._flusher.shutdown(wait=True)  # every queued flush (and fd close) has run
                self._flusher = None
        for entry, rec in zip(entries, results):
            keep[entry.path] = rec
        self._write_journal(force=True)
