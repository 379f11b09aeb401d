# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""How the copy engine reads: page-cache probes, O_DIRECT reads of cold local files, a reader thread ahead of the hash.

``ChunkReader`` is the part of ``syncer.Syncer`` that turns an open source into buffers: each buffer is hashed and
then written as it is, so what is hashed is what is written. ``_INLINE`` stands in for the flusher thread when a file
is copied outside a run.
"""

from __future__ import annotations

import concurrent.futures
import errno
import functools
import io
import mmap
import os
import queue
import threading

from .common import DIRECT_ALIGN, DIRECT_BUFFER, DIRECT_DEPTH, DIRECT_MIN_BYTES


def _advise(fd, advice, offset=0, length=0):
    """posix_fadvise where the platform has it; advice is a name such as ``POSIX_FADV_SEQUENTIAL``."""
    try:
        os.posix_fadvise(fd, offset, length, getattr(os, advice))
    except (AttributeError, OSError):
        pass


@functools.lru_cache(maxsize=None)
def _libc():
    """ctypes and the C library with mmap, munmap and mincore typed (loaded once), or None (no ctypes, not
    Linux/glibc-like)."""
    try:
        import ctypes  # pylint: disable=import-outside-toplevel
        lib = ctypes.CDLL(None, use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    except (ImportError, OSError, AttributeError):
        return None
    return ctypes, lib


def _mincore_resident(fd, offsets):
    """Whether the page of each offset of ``fd`` is in the page cache, from mincore(2) on a mapping of that page
    (neither the mapping nor mincore reads the file); None when it cannot be asked."""
    loaded = _libc()
    if loaded is None:
        return None
    ctypes, lib = loaded
    page = mmap.PAGESIZE
    failed = ctypes.c_void_p(-1).value
    vec = ctypes.create_string_buffer(1)
    for offset in offsets:
        base = offset - offset % page
        addr = lib.mmap(None, page, mmap.PROT_READ, mmap.MAP_SHARED, fd, base)
        if addr is None or addr == failed:
            return None
        try:
            if lib.mincore(addr, page, vec) != 0:
                return None
        finally:
            lib.munmap(addr, page)
        if not ord(vec.raw[:1]) & 1:
            return False
    return True


def _page_cached(fd, start, end):
    """Whether the bytes of ``fd`` from ``start`` to ``end`` look resident in the page cache.

    Looks at one page at the start, the middle and the end with mincore(2), which reads nothing. Where mincore
    cannot be called, probes one byte there with ``preadv(..., RWF_NOWAIT)``, which fails with EAGAIN instead
    of waiting for the device; but a buffered read that misses the cache starts readahead before it gives up,
    and on a fast disk that read can land before the kernel looks again, so a cold file can pass for a warm one
    (seen on a busy 2-core VM). True when neither can tell (no RWF_NOWAIT, or the file system refuses the flag):
    then the caller keeps reading through the page cache, as before.
    """
    if end <= start:
        return True
    offsets = (start, start + (end - start) // 2, end - 1)
    resident = _mincore_resident(fd, offsets)
    if resident is not None:
        return resident
    flag = getattr(os, "RWF_NOWAIT", None)
    if flag is None or not hasattr(os, "preadv"):
        return True
    probe = bytearray(1)
    for offset in offsets:
        try:
            os.preadv(fd, [probe], offset, flag)
        except BlockingIOError:
            return False
        except OSError:
            return True
    return True


def _read_ahead(readinto, size, depth, aligned=False):
    """Yield memoryviews filled by a reader thread, ``depth`` buffers of ``size`` bytes in flight at most.

    A view handed out is not refilled before the consumer asks for the next one. The reader stops (and is
    joined) when the generator is closed, also on errors; a reader error is raised in the consumer.
    ``aligned`` buffers are anonymous memory maps (page-aligned, as O_DIRECT reads need).
    """
    if aligned:
        views = [memoryview(mmap.mmap(-1, size)) for _slot in range(depth)]
    else:
        views = [memoryview(bytearray(size)) for _slot in range(depth)]
    free = queue.Queue()
    full = queue.Queue()
    stop = threading.Event()
    for i in range(depth):
        free.put(i)

    def reader():
        try:
            while True:
                i = free.get()
                if i is None or stop.is_set():
                    return
                num = readinto(views[i])
                full.put((i, num, None))
                if not num:
                    return
        except BaseException as exc:  # pylint: disable=broad-exception-caught
            full.put((None, 0, exc))

    thread = threading.Thread(target=reader, name="artifact-sync-reader", daemon=True)
    thread.start()
    try:
        while True:
            i, num, exc = full.get()
            if exc is not None:
                raise exc
            if not num:
                return
            chunk = views[i][:num]
            try:
                yield chunk
            finally:
                chunk.release()
            free.put(i)
    finally:
        stop.set()
        free.put(None)
        thread.join()


class _InlineExecutor:  # pylint: disable=too-few-public-methods
    """The flusher when no flusher thread runs (a copy_file call outside a run): each flush runs at once."""

    @staticmethod
    def submit(func, *args):
        future = concurrent.futures.Future()
        try:
            future.set_result(func(*args))
        except Exception as exc:  # pylint: disable=broad-exception-caught
            future.set_exception(exc)
        return future


_INLINE = _InlineExecutor()


class ChunkReader:
    """The reading half of ``syncer.Syncer``: its ``buffer_size``, ``read_ahead``, ``direct_io`` and ``_count``."""

    buffer_size = 0
    read_ahead = 0
    direct_io = False

    def _count(self, **kw):
        """Add to the run's statistics (``Syncer._count``)."""
        raise NotImplementedError

    def _chunks(self, src):
        """Yield memoryviews of the (already positioned) source, each valid until the next one is asked for.

        The bytes come in private buffers owned by this generator: the caller hashes a buffer and writes
        that same buffer, so what is hashed is exactly what is written (a source file changed meanwhile
        cannot make them differ, as it could with a memory map). With ``self.read_ahead`` a reader thread
        fills the next buffers (that many, so memory stays bounded) while the caller
        hashes and writes the current one: read(), hashlib's update() and write() release the GIL, so
        reading (disk or network) overlaps hashing and writing.
        """
        if isinstance(src, io.FileIO):
            direct = self._direct_chunks(src)
            if direct is not None:
                yield from direct
                return
            fd = src.fileno()

            def readinto(view):
                return os.readv(fd, [view])
        else:
            raw_readinto = getattr(src, "readinto", None)

            def readinto(view):
                if raw_readinto is not None:
                    return raw_readinto(view) or 0
                data = src.read(len(view))
                view[: len(data)] = data
                return len(data)

        size = self.buffer_size
        if self.read_ahead < 1:
            view = memoryview(bytearray(size))
            while True:
                num = readinto(view)
                if not num:
                    return
                yield view[:num]
        else:
            yield from _read_ahead(readinto, size, self.read_ahead)

    def _direct_chunks(self, src):
        """A generator of ``_chunks`` for a local file read with O_DIRECT, or None to read through the page cache.

        Staging reads each model byte once, usually from a volume that does not have it in memory (the "cold"
        case). Read through the page cache, every byte costs a page-cache fill and a copy into the buffer,
        which on a 2-core node is CPU that the hash needs. O_DIRECT reads land in the buffer straight from the
        device and leave the page cache to the destination's writeback. A reader thread keeps DIRECT_DEPTH
        reads of DIRECT_BUFFER bytes in flight, since there is no kernel readahead on this path; the consumer
        gets ``self.buffer_size`` slices, hashed and written while they are still in the CPU cache, and each
        slice is the very buffer that is written, as on the page-cache path.

        Used only when the file is big enough, the start offset is block-aligned (a resume at an odd offset
        reads through the page cache) and the file is not already resident (``_page_cached``: re-reading a
        warm file from the device would be slower). A file system that refuses O_DIRECT (tmpfs, some FUSE) at
        open or at the first read falls back to the page cache.
        """
        if not self.direct_io or not hasattr(os, "O_DIRECT") or not hasattr(os, "preadv"):
            return None
        fd = src.fileno()
        try:
            pos = os.lseek(fd, 0, os.SEEK_CUR)
            end = os.fstat(fd).st_size
        except OSError:
            return None
        if pos % DIRECT_ALIGN or end - pos < DIRECT_MIN_BYTES or _page_cached(fd, pos, end):
            return None
        try:
            # The same open file (not the same path name, which may have been replaced meanwhile).
            direct_fd = os.open("/proc/self/fd/%d" % fd, os.O_RDONLY | os.O_DIRECT)  # pylint: disable=no-member
        except OSError:
            return None
        return self._direct_gen(fd, direct_fd, pos)

    def _direct_gen(self, fd, direct_fd, pos):
        state = {"pos": pos, "direct": True}

        def readinto(view):
            if state["direct"]:
                try:
                    num = os.preadv(direct_fd, [view], state["pos"])
                except OSError as exc:
                    if exc.errno != errno.EINVAL:
                        raise
                    num = None  # the file system takes the flag at open but not the read: page cache from here
                state["direct"] = num == len(view)
                if num:
                    state["pos"] += num
                    self._count(direct_read_bytes=num)
                    return num
            # After a short direct read (the end of the file, its partial last block included) the page cache
            # confirms the end, or reads on should the file have grown meanwhile.
            num = os.preadv(fd, [view], state["pos"])
            state["pos"] += num
            return num

        step = self.buffer_size
        chunks = _read_ahead(readinto, DIRECT_BUFFER, DIRECT_DEPTH, aligned=True)
        try:
            for chunk in chunks:
                for start in range(0, len(chunk), step):
                    piece = chunk[start:start + step]
                    try:
                        yield piece
                    finally:
                        piece.release()
        finally:
            chunks.close()  # joins the reader before its descriptor is closed
            os.close(direct_fd)
