"""Open a trace file as a byte stream, decompressing gzip or zstd found by magic bytes.

The magic bytes decide, not the name: ``trace.csv`` may hold gzip and ``trace.csv.gz``
plain text. Other archive formats are named in the error so the user knows what to unpack.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import BinaryIO, Protocol

from traces.errors import TraceError

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
UNREAD_MAGIC = {
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"PK\x03\x04": "zip",
    b"7z\xbc\xaf\x27\x1c": "7z",
    b"PAR1": "Parquet",
}
ZSTD_INPUT_BYTES = 1 << 16


class ByteStream(Protocol):
    def read(self, num_bytes: int) -> bytes: ...

    def close(self) -> None: ...


def open_stream(path: Path) -> tuple[ByteStream, str | None]:
    """The file's decompressed bytes as a stream, and its compression ("gzip", "zstd" or
    None)."""
    try:
        file = path.open("rb")
    except OSError as error:
        raise TraceError(path, f"cannot open the file ({error.strerror})",
                         fix="check the path and its read permission") from None
    magic = file.read(8)
    file.seek(0)
    if magic.startswith(GZIP_MAGIC):
        return _Checked(path, gzip.GzipFile(fileobj=file, mode="rb"), "gzip", file), "gzip"
    if magic.startswith(ZSTD_MAGIC):
        try:
            return _Checked(path, _ZstdStream(path, file), "zstd", file), "zstd"
        except TraceError:
            file.close()
            raise
    for prefix, name in UNREAD_MAGIC.items():
        if magic.startswith(prefix):
            file.close()
            raise TraceError(path, f"this is {name} data, not a text trace",
                             fix="unpack it first (gzip and zstd files are read directly)")
    return _Checked(path, file, None, file), None


class _Checked:
    """A stream whose read errors (corrupt or truncated compressed data, a failing disk)
    become a ``TraceError``; ``kind`` names the compression, None for none."""

    def __init__(self, path: Path, stream: ByteStream, kind: str | None, file: BinaryIO):
        self.path, self.stream, self.kind, self.file = path, stream, kind, file

    def read(self, num_bytes: int) -> bytes:
        try:
            return self.stream.read(num_bytes)
        except (OSError, EOFError, zlib.error) as error:
            if self.kind is None:
                raise TraceError(self.path, f"cannot read the file ({error})",
                                 fix="check the file and the disk it is on") from None
            raise TraceError(self.path, f"corrupt or truncated {self.kind} data ({error})",
                             fix=f"re-create the {self.kind} file from the original trace") from None

    def close(self) -> None:
        self.stream.close()
        if self.file is not self.stream:
            self.file.close()


class _ZstdStream:
    """zstd frames decoded as they are read; a frame cut short is an error, not an EOF.

    ``zstandard``'s own stream reader ends quietly on a truncated frame, which would load
    part of a trace without a word, so frames are fed through a decompressor object whose
    ``eof`` says whether the frame finished.
    """

    def __init__(self, path: Path, file: BinaryIO) -> None:
        try:
            import zstandard
        except ImportError:
            raise TraceError(path, "this is zstd data and the 'zstandard' package is missing",
                             fix="pip install zstandard, or decompress the file first") from None
        self._zstd, self._file, self._path = zstandard, file, path
        self._decoder = zstandard.ZstdDecompressor().decompressobj()
        self._buffer = bytearray()
        self._input_done = False
        self._in_frame = False

    def read(self, num_bytes: int) -> bytes:
        while len(self._buffer) < num_bytes and not self._input_done:
            self._feed(self._file.read(ZSTD_INPUT_BYTES))
        out = bytes(self._buffer[:num_bytes])
        del self._buffer[:num_bytes]
        return out

    def _feed(self, data: bytes) -> None:
        if not data:
            self._input_done = True
            if self._in_frame:
                raise OSError("the last zstd frame is cut short")
            return
        try:
            while data:
                if self._decoder.eof:  # another frame follows
                    self._decoder = self._zstd.ZstdDecompressor().decompressobj()
                self._buffer += self._decoder.decompress(data)
                data = self._decoder.unused_data if self._decoder.eof else b""
        except self._zstd.ZstdError as error:
            raise OSError(str(error)) from None
        self._in_frame = not self._decoder.eof

    def close(self) -> None:
        self._file.close()
