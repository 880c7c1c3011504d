"""Real traces shipped with the package (see ``traces/data/README.md`` for licences)."""

from __future__ import annotations

from pathlib import Path

from traces.errors import TraceError, excerpt

DATA_DIR = Path(__file__).resolve().parent / "data"

BUNDLED: dict[str, Path] = {
    "azure-conv": DATA_DIR / "AzureLLMInferenceTrace_conv.csv",
    "azure-code": DATA_DIR / "AzureLLMInferenceTrace_code.csv",
    "mooncake-conv": DATA_DIR / "mooncake_conversation_trace.jsonl",
}


def bundled(name: str) -> Path:
    """Path of a bundled trace by name, case-insensitive: azure-conv, azure-code, mooncake-conv."""
    path = BUNDLED.get(name.strip().lower())
    if path is None:
        raise TraceError(None, f"unknown bundled trace {excerpt(name)}",
                         fix=f"use one of {sorted(BUNDLED)}")
    return path


def resolve_trace_path(name_or_path: str | Path) -> Path:
    """An existing file path as given, else the bundled trace of that name."""
    path = Path(name_or_path).expanduser()
    try:
        is_file, is_dir = path.is_file(), path.is_dir()
    except (OSError, ValueError) as error:  # a name too long, or holding a NUL byte
        raise TraceError(excerpt(str(path)), f"not a usable file name ({error.__class__.__name__})",
                         fix="give a trace file path or a bundled name") from None
    if is_file:
        return path
    if isinstance(name_or_path, str) and name_or_path.strip().lower() in BUNDLED:
        return bundled(name_or_path)
    problem = "is a directory, not a file" if is_dir else "file not found"
    raise TraceError(path, problem,
                     fix=f"give a trace file path or a bundled name ({', '.join(sorted(BUNDLED))})")
