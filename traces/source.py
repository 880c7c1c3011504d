"""Read a trace file as checked UTF-8 text in chunks that end on line boundaries.

Streaming keeps a load's peak memory a small multiple of the file size: each format reader
turns one chunk into numpy columns and drops it before the next. Every chunk is checked
on the way in, so readers see only clean text:

- gzip and zstd are decompressed (``traces.compressed``); a UTF-8 byte-order mark is
  dropped; UTF-16/32 text, NUL bytes and invalid UTF-8 are refused, naming the line;
- ``\\r\\n`` and a bare ``\\r`` both end a line, as Python's universal newlines count
  them, and become ``\\n``;
- a line longer than ``MAX_LINE_BYTES`` is refused: trace lines hold a few numbers (and
  Mooncake's block ids), so a longer one means the file is not a trace.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from traces.compressed import ByteStream, open_stream
from traces.errors import TraceError, excerpt

MAX_LINE_BYTES = 1 << 20
MIN_CHUNK_BYTES = 1 << 16
MAX_CHUNK_BYTES = MAX_LINE_BYTES // 2  # then only a piece read for a long line can hold one
CHUNKS_PER_FILE = 16
NEWLINE = ord("\n")
UTF8_BOM = b"\xef\xbb\xbf"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


@dataclass(frozen=True)
class TextChunk:
    """Whole lines of the file, ``\\n``-terminated (the file's last may lack it)."""

    data: bytes
    first_line: int  # 1-based file line of data's first line

    def line_of(self, offset: int) -> int:
        """File line holding byte ``offset`` of ``data``."""
        return self.first_line + self.data.count(b"\n", 0, offset)


def chunk_bytes_for(file_bytes: int) -> int:
    """About a sixteenth of the file, within [64 KiB, 512 KiB]: small enough for memory,
    large enough that numpy's per-call cost stays hidden."""
    return min(max(file_bytes // CHUNKS_PER_FILE, MIN_CHUNK_BYTES), MAX_CHUNK_BYTES)


def text_chunks(path: Path, chunk_bytes: int | None = None) -> Generator[TextChunk, None, None]:
    """The file as checked text chunks of about ``chunk_bytes`` (default: by file size)."""
    if chunk_bytes is None:
        chunk_bytes = chunk_bytes_for(path.stat().st_size)
    chunk_bytes = min(max(chunk_bytes, len(UTF8_BOM)), MAX_CHUNK_BYTES)
    stream, compression = open_stream(path)
    try:
        yield from _chunks(path, stream, chunk_bytes, compression)
    finally:
        stream.close()


def _chunks(path: Path, stream: ByteStream, chunk_bytes: int,
            compression: str | None) -> Iterator[TextChunk]:
    pending, line, want_bytes, first = b"", 1, chunk_bytes, True
    while True:
        block = _read(stream, want_bytes)
        at_end = len(block) < want_bytes
        data = pending + block
        if first:
            data = _checked_start(path, data, compression)
            first = False
        held = b""
        if data.endswith(b"\r") and not at_end:
            data, held = data[:-1], b"\r"  # a "\n" may follow in the next block
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        cut = len(data) if at_end else data.rfind(b"\n") + 1
        piece, pending = data[:cut], data[cut:] + held
        del block, data  # no second copy of the chunk while the reader works on it
        _check_line_lengths(path, piece, pending, line)
        want_bytes = chunk_bytes if cut else len(pending) + chunk_bytes  # grow for a long line
        if piece:
            chunk = TextChunk(piece, line)
            _check_text(path, chunk)
            line += piece.count(b"\n")
            del piece
            yield chunk
            del chunk
        if at_end:
            return


def _read(stream: ByteStream, num_bytes: int) -> bytes:
    """Up to ``num_bytes``, fewer only at the end (decompressors may return short reads)."""
    block = stream.read(num_bytes)
    while 0 < len(block) < num_bytes:
        more = stream.read(num_bytes - len(block))
        if not more:
            break
        block += more
    return block


def _checked_start(path: Path, data: bytes, compression: str | None) -> bytes:
    inner = "file is " if compression is None else f"{compression}-compressed file holds "
    if data.startswith(UTF16_BOMS):
        raise TraceError(path, f"the {inner}UTF-16 or UTF-32 text", line=1,
                         fix="save the trace as UTF-8")
    if data.startswith((b"\x1f\x8b", b"\x28\xb5\x2f\xfd")):
        raise TraceError(path, f"the {inner}compressed data again (compressed twice)",
                         fix="decompress it once, then load the result")
    return data.removeprefix(UTF8_BOM)


def _check_line_lengths(path: Path, piece: bytes, pending: bytes, line: int) -> None:
    """A piece over ``MAX_LINE_BYTES`` comes only from reading on for a long line (chunks
    are at most half of it), so only then are its lines measured."""
    if len(piece) > MAX_LINE_BYTES:
        ends = np.flatnonzero(np.frombuffer(piece, dtype=np.uint8) == NEWLINE)
        bounds = np.concatenate(([-1], ends, [len(piece)]))
        too_long = np.flatnonzero(np.diff(bounds) - 1 > MAX_LINE_BYTES)
        if too_long.size:
            _raise_long(path, line + int(too_long[0]))
    if len(pending) > MAX_LINE_BYTES:
        _raise_long(path, line + piece.count(b"\n"))


def _raise_long(path: Path, line: int) -> None:
    raise TraceError(path, f"line longer than {MAX_LINE_BYTES:,} bytes", line=line,
                     fix="a trace line holds a few numbers; check that this is a trace file")


def _check_text(path: Path, chunk: TextChunk) -> None:
    data = chunk.data
    nul = data.find(b"\x00")  # in valid UTF-8 a 0 byte is always the NUL character
    if nul >= 0:
        raise TraceError(path, "a NUL byte: binary data or UTF-16 text, not a UTF-8 trace",
                         line=chunk.line_of(nul),
                         fix="point at a CSV or JSON-lines trace in UTF-8 (gzip or zstd "
                             "compressed is fine)")
    if data.isascii():
        return
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as error:
        line_start = data.rfind(b"\n", 0, error.start) + 1
        bad = data[error.start : error.end]
        raise TraceError(
            path, f"invalid UTF-8 ({excerpt(bad)} at byte {error.start - line_start + 1} "
                  f"of the line)",
            line=chunk.line_of(error.start),
            fix="save the trace as UTF-8 (or fix the damaged bytes)",
        ) from None


def prepended(first: list[TextChunk], rest: Iterator[TextChunk]) -> Iterator[TextChunk]:
    """``first`` then ``rest``, letting go of each chunk of ``first`` once it is handed on
    (``itertools.chain`` would hold them all until the end)."""
    while first:
        yield first.pop(0)
    yield from rest
