"""layer_stream: the streaming tar member index and the layer without the draft, on synthetic layers.

The layers are written here byte by byte from tarfile headers of different formats (GNU long names, PAX
headers, ustar), with './' prefixes, directories listed after their files, symlinks and hard links, then read
back with tarfile's own random-access reader (not the code under test) to check what came out.
"""

import gzip
import hashlib
import io
import json
import tarfile
import tracemalloc
import zlib

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import draft_removal_modelcar
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import layers as S
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import oci_blobs
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError

LONG = "models/target/" + "very-long-directory-name-" * 5 + "/shard-00001-of-00002.safetensors"
PAX = "models/target/tokenizer-\u00e9\u00e8-" + "x" * 120 + ".json"


def _member(name, kind="file", data=b"", fmt=tarfile.PAX_FORMAT, linkname="", mode=0o644):
    info = tarfile.TarInfo(name)
    info.mtime, info.uid, info.gid, info.uname, info.mode = 1700000000, 1000, 1000, "someone", mode
    if kind == "dir":
        info.type = tarfile.DIRTYPE
    elif kind == "symlink":
        info.type, info.linkname = tarfile.SYMTYPE, linkname
    elif kind == "hardlink":
        info.type, info.linkname = tarfile.LNKTYPE, linkname
    else:
        info.size = len(data)
    out = info.tobuf(format=fmt, encoding="utf-8", errors="strict")
    if kind == "file":
        out += data + bytes(-len(data) % 512)
    return out


FILES = {
    "models/target/config.json": b'{"architectures": ["LlamaForCausalLM"]}',
    LONG: bytes(range(256)) * 4099,
    PAX: b'{"model": "BPE"}' * 50,
    "models/draft/config.json": b'{"architectures": ["LlamaForCausalLMEagle3"]}',
    "models/draft/sub/model.safetensors": b"D" * 70001,
}


def foreign_tar(end_padding=10240):
    """A layer as another writer might make it: one tar with target and draft, mixed formats, links, dirs after files."""
    parts = [
        _member("./", "dir", mode=0o755),
        _member("./models/target/config.json", data=FILES["models/target/config.json"], fmt=tarfile.USTAR_FORMAT),
        _member("models", "dir", mode=0o755),  # listed after a file below it
        _member("models/target/", "dir", mode=0o750),
        _member(LONG, data=FILES[LONG], fmt=tarfile.GNU_FORMAT, mode=0o600),
        _member(PAX, data=FILES[PAX], fmt=tarfile.PAX_FORMAT),
        _member("models/target/run.sh", data=b"#!/bin/sh\necho hi\n", mode=0o700),
        _member("models/target/model.safetensors", "symlink", linkname=LONG.split("/", 2)[2]),
        _member("models/target/config-copy.json", "hardlink", linkname="./models/target/config.json"),
        _member("models/draft", "dir"),
        _member("models/draft/config.json", data=FILES["models/draft/config.json"], fmt=tarfile.GNU_FORMAT),
        _member("models/draft/sub/", "dir"),
        _member("models/draft/sub/model.safetensors", data=FILES["models/draft/sub/model.safetensors"]),
        _member("models/draft/same.json", "hardlink", linkname="models/target/config.json"),
        _member("models/empty", "dir"),
    ]
    data = b"".join(parts) + bytes(1024)
    return data + bytes(-len(data) % end_padding)


def _desc(blob, media_type=oci_blobs.MT_LAYER_TAR):
    return {"mediaType": media_type, "digest": oci_blobs.sha256_digest(blob), "size": len(blob)}


def _opener(blob):
    return lambda: io.BytesIO(blob)


def _contents(tar_bytes):
    """{name: ('file', bytes, mode) | ('symlink', target) | ('hardlink', target) | ('dir',)} read with tarfile's random-access reader."""
    out = {}
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as tar:
        for m in tar.getmembers():
            assert (m.mtime, m.uid, m.gid, m.uname) == (0, 0, 0, "")
            if m.isdir():
                out[m.name] = ("dir",)
            elif m.issym():
                out[m.name] = ("symlink", m.linkname)
            elif m.islnk():
                out[m.name] = ("hardlink", m.linkname)
            else:
                out[m.name] = ("file", tar.extractfile(m).read(), m.mode)
    return out


def test_index_and_layer_without_the_draft():
    blob = foreign_tar()
    scan = S.scan(_opener(blob), _desc(blob), "models/draft", diff_id=oci_blobs.sha256_digest(blob))
    assert scan.paths == ["models/target/config.json", LONG, PAX, "models/target/run.sh", "models/target/model.safetensors",
                          "models/target/config-copy.json", "models/draft/config.json", "models/draft/sub/model.safetensors",
                          "models/draft/same.json"]
    assert scan.kept == scan.paths[:6] and scan.removed == 3
    assert scan.diff_id == oci_blobs.sha256_digest(blob) and scan.compression is None and scan.read_bytes == len(blob)
    out = b"".join(bytes(c) for c in S.FilteredLayer(_opener(blob), _desc(blob), "models/draft", scan).chunks())
    assert (len(out), oci_blobs.sha256_digest(out)) == (scan.size, scan.digest)
    got = _contents(out)
    assert got == {
        "models": ("dir",), "models/target": ("dir",),
        "models/target/config.json": ("file", FILES["models/target/config.json"], 0o644),
        LONG: ("file", FILES[LONG], 0o644),
        PAX: ("file", FILES[PAX], 0o644),
        "models/target/run.sh": ("file", b"#!/bin/sh\necho hi\n", 0o755),
        "models/target/model.safetensors": ("symlink", LONG.split("/", 2)[2]),
        "models/target/config-copy.json": ("hardlink", "models/target/config.json"),
    }  # no draft, no directory that held only draft files, no empty directory
    with tarfile.open(fileobj=io.BytesIO(out), mode="r:") as tar:  # the hard link resolves
        assert tar.extractfile("models/target/config-copy.json").read() == FILES["models/target/config.json"]
        names = tar.getnames()
    # the source order is kept (its first file came before its directories); a directory only when something below it stays
    assert names[:3] == ["models/target/config.json", "models", "models/target"]


def test_gzip_and_concatenated_gzip_members_give_the_same_layer():
    plain = foreign_tar()
    plain_scan = S.scan(_opener(plain), _desc(plain), "models/draft")
    one = gzip.compress(plain, mtime=0)
    half = len(plain) // 3
    two = gzip.compress(plain[:half], mtime=0) + gzip.compress(plain[half:], mtime=0) + bytes(100)  # members + zero padding
    for blob in (one, two):
        scan = S.scan(_opener(blob), _desc(blob, "application/vnd.oci.image.layer.v1.tar+gzip"), "models/draft", diff_id=oci_blobs.sha256_digest(plain))
        assert scan.compression == "gzip" and scan.diff_id == oci_blobs.sha256_digest(plain)
        assert (scan.digest, scan.size, scan.kept) == (plain_scan.digest, plain_scan.size, plain_scan.kept)


def test_a_removed_path_that_is_not_there_changes_nothing_but_the_normalisation():
    blob = foreign_tar()
    scan = S.scan(_opener(blob), _desc(blob), "models/other")
    assert scan.removed == 0 and scan.kept == scan.paths and len(scan.paths) == 9


@pytest.mark.parametrize("mutate, words", [
    (lambda b: b[:-1] + b"\x01", "does not match its digest"),
    (lambda b: b + b"\0" * 512, "longer than the"),
])
def test_a_blob_that_does_not_match_its_descriptor_is_refused(mutate, words):
    blob = foreign_tar()
    with pytest.raises(SpecDecodingError, match=words):
        S.scan(_opener(mutate(blob)), _desc(blob), "models/draft")


def test_short_blob_wrong_diff_id_truncated_gzip_and_zstd_are_refused():
    blob = foreign_tar()
    short = _desc(blob)
    short["size"] += 10
    with pytest.raises(SpecDecodingError, match="has %d bytes, its descriptor says %d" % (len(blob), len(blob) + 10)):
        S.scan(_opener(blob), short, "models/draft")
    with pytest.raises(SpecDecodingError, match="diff_id says sha256:0"):
        S.scan(_opener(blob), _desc(blob), "models/draft", diff_id="sha256:" + "0" * 64)
    cut = gzip.compress(blob)[:-2000]
    with pytest.raises(SpecDecodingError, match="gzip stream ends early|ends inside"):
        S.scan(_opener(cut), _desc(cut), "models/draft")
    zstd = S.ZSTD_MAGIC + b"\0" * 100
    with pytest.raises(ValidationError, match="zstd-compressed.*--dest-compress-format gzip"):
        S.scan(_opener(zstd), _desc(zstd), "models/draft")
    with pytest.raises(ValidationError, match="^storageUri: layer .* is zstd-compressed"):
        S.scan(_opener(blob), _desc(blob, "application/vnd.oci.image.layer.v1.tar+zstd"), "models/draft")
    with pytest.raises(ValidationError, match="not a tar layer"):
        S.scan(_opener(blob), _desc(blob, "application/vnd.cncf.helm.chart.content.v1.tgz"), "models/draft")
    garbage = b"no tar here " * 100
    with pytest.raises(SpecDecodingError, match="not a (readable )?tar archive"):
        S.scan(_opener(garbage), _desc(garbage), "models/draft")


def test_a_kept_hard_link_into_the_draft_is_refused_with_both_names():
    blob = b"".join([_member("models/draft/w.bin", data=b"w" * 600), _member("models/target/w.bin", "hardlink", linkname="models/draft/w.bin")])
    blob += bytes(1024)
    with pytest.raises(ValidationError, match="models/target/w.bin in layer .* is a hard link to models/draft/w.bin"):
        S.scan(_opener(blob), _desc(blob), "models/draft")


class _Generated:
    """A blob produced piece by piece (never whole): a tar with one big file of a repeating pattern."""

    def __init__(self, parts):
        self.parts = iter(parts)
        self.buf = b""

    def read(self, n):
        while len(self.buf) < n:
            piece = next(self.parts, None)
            if piece is None:
                break
            self.buf += piece
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def close(self):
        pass


def _big_layer(size, block):
    """(factory of the raw parts, digest, length) of a tar: a small draft file, then one file of ``size`` bytes."""
    def parts():
        yield _member("models/draft/config.json", data=b"{}")
        info = tarfile.TarInfo("models/target/model.safetensors")
        info.size = size
        yield info.tobuf(format=tarfile.PAX_FORMAT)
        for _i in range(size // len(block)):
            yield block
        yield bytes(-size % 512) + bytes(1024)
    h, n = hashlib.sha256(), 0
    for p in parts():
        h.update(p)
        n += len(p)
    return parts, "sha256:" + h.hexdigest(), n


def _gzip_parts(parts):
    z = zlib.compressobj(1, wbits=31)
    for p in parts():
        out = z.compress(p)
        if out:
            yield out
    yield z.flush()


@pytest.mark.parametrize("compressed", [False, True])
def test_a_big_layer_is_streamed_in_bounded_memory(compressed):
    """96 MiB (plain) / 160 MiB of zeros (gzip, about 160 KiB compressed: one read inflates a lot) with < 8 MiB traced."""
    size = (96 if not compressed else 160) << 20
    block = (b"\0" if compressed else bytes(range(256))) * 4096
    parts, tar_digest, tar_len = _big_layer(size, block)
    if compressed:
        blob_parts = list(_gzip_parts(parts))  # small: zeros compress ~1000x
        desc = {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": oci_blobs.sha256_digest(b"".join(blob_parts)),
                "size": sum(len(p) for p in blob_parts)}

        def opener():
            return _Generated(iter(blob_parts))
    else:
        desc = {"mediaType": oci_blobs.MT_LAYER_TAR, "digest": tar_digest, "size": tar_len}

        def opener():
            return _Generated(parts())
    tracemalloc.start()
    try:
        scan = S.scan(opener, desc, "models/draft", diff_id=tar_digest)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert scan.kept == ["models/target/model.safetensors"] and scan.removed == 1 and scan.diff_id == tar_digest
    assert scan.size == 512 + size + 1024  # the file's header (the source lists no directories), its data, the end blocks
    assert peak < 8 << 20, "peak traced memory %d bytes" % peak


class _Blobs:
    """A registry's read side over a dict of blobs."""

    def __init__(self):
        self.blobs = {}

    def put(self, data):
        self.blobs[oci_blobs.sha256_digest(data)] = data
        return oci_blobs.sha256_digest(data)

    def get_blob(self, digest):
        return self.blobs[digest]

    def open_blob(self, digest):
        return io.BytesIO(self.blobs[digest])


def test_plan_image_rewrites_a_foreign_gzip_layer_that_holds_target_and_draft():
    plain = foreign_tar()
    blobs = _Blobs()
    layer = gzip.compress(plain, mtime=0)
    config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": [oci_blobs.sha256_digest(plain)]},
                         "history": [{"created_by": "skopeo"}]}).encode()
    manifest = {"schemaVersion": 2, "mediaType": oci_blobs.MT_MANIFEST,
                "config": {"mediaType": oci_blobs.MT_CONFIG, "digest": blobs.put(config), "size": len(config)},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": blobs.put(layer), "size": len(layer)}]}
    raw = json.dumps(manifest).encode()
    actions, repl, new_manifest, new_config, uploads = draft_removal_modelcar.plan_image(blobs, raw, "models/draft", oci_blobs.sha256_digest(raw))
    assert actions == ["rewrite"]
    desc, diff_id = repl[0]
    out = b"".join(bytes(c) for c in uploads[0].chunks())
    assert desc["digest"] == diff_id == oci_blobs.sha256_digest(out) and desc["size"] == len(out) and desc["mediaType"] == oci_blobs.MT_LAYER_TAR
    assert desc["annotations"][oci_blobs.ANN_TITLE] == "models/target (6 files)"
    assert draft_removal_modelcar.layer_paths(desc) == [n for n in _contents(out) if _contents(out)[n][0] != "dir"]
    assert json.loads(new_config)["rootfs"]["diff_ids"] == [diff_id]
    assert json.loads(new_manifest)["layers"] == [desc]
    # a second removal reads the annotations, not the layer: nothing left to remove
    blobs.put(out)
    blobs.put(new_config)
    again = draft_removal_modelcar.plan_image(blobs, new_manifest, "models/draft", oci_blobs.sha256_digest(new_manifest))
    assert again[0] == ["keep"] and again[2] is None


def test_registry_blob_stream_answers_the_challenge_follows_the_redirect_without_credentials_and_retries():
    from http.server import BaseHTTPRequestHandler  # pylint: disable=import-outside-toplevel

    from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import registry as R  # pylint: disable=import-outside-toplevel
    from tests.loopback_http import serving  # pylint: disable=import-outside-toplevel

    blob = gzip.compress(foreign_tar(), mtime=0)
    digest = oci_blobs.sha256_digest(blob)
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # pylint: disable=arguments-differ
            pass

        def _send(self, status, body=b"", headers=None):
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):  # pylint: disable=invalid-name
            auth = self.headers.get("Authorization")
            seen.append((self.path, auth))
            if self.path == "/v2/repo/blobs/" + digest:
                if not auth:
                    return self._send(401, b"{}", {"WWW-Authenticate": 'Basic realm="test"'})
                # blob storage on another host name (the same server): no registry credentials may go there
                return self._send(307, headers={"Location": "http://localhost:%d/storage/blob?sig=1" % self.server.server_address[1]})
            if self.path == "/storage/blob?sig=1":
                if len([p for p, _a in seen if p == self.path]) == 1:
                    return self._send(503, b"busy")  # retried
                return self._send(200, blob)
            return self._send(404)

    with serving(Handler) as url:
        client = R.RegistryClient(R.ImageRef.parse(url[len("http://"):] + "/repo:v1"), "alice", "pw", tls_verify=False, backoff=0.01)
        client.scheme = "http"
        reader = draft_removal_modelcar.RemoteImage(client)
        found = S.scan(lambda: reader.open_blob(digest), {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest,
                                                          "size": len(blob)}, "models/draft")
    assert found.compression == "gzip" and len(found.kept) == 6
    assert [p for p, _a in seen] == ["/v2/repo/blobs/" + digest] * 2 + ["/storage/blob?sig=1"] * 2
    assert seen[1][1].startswith("Basic ") and seen[2][1] is None and seen[3][1] is None  # storage never gets the credentials
