"""A PNG read back from its bytes, for the tests of the report plots (unit, module and e2e tiers alike)."""

import struct
import zlib

SIGNATURE = b"\x89PNG\r\n\x1a\n"


def check_png(path):
    """``(width, height, file size)`` of a PNG file, after checking its signature, that every chunk carries a correct CRC,
    that IHDR comes first and IEND last, and that the image data (IDAT, possibly spread over several chunks) inflates."""
    with open(path, "rb") as handle:
        data = handle.read()
    assert data[:8] == SIGNATURE, path
    pos, kinds, idat = 8, [], b""
    while pos < len(data):
        length = struct.unpack(">I", data[pos:pos + 4])[0]
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        assert struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0] == zlib.crc32(kind + body) & 0xFFFFFFFF, (path, kind)
        kinds.append(kind)
        if kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and b"IDAT" in kinds, (path, kinds)
    assert zlib.decompress(idat), path
    width, height = struct.unpack(">II", data[16:24])
    return width, height, len(data)
