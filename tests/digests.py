"""The SHA-256 of a file, read in 1 MiB chunks: how the tests check that bytes arrived unchanged (a staged copy, an
image pulled back, a blob written by hand), computed apart from the collection's own hashing code."""
import hashlib


def sha256_file(path):
    """The hex SHA-256 of the file at ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
