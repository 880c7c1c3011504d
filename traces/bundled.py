"""Real traces shipped with the package (see ``traces/data/README.md`` for licences)."""

from __future__ import annotations

from pathlib import Path

from traces.errors import TraceError

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
        raise TraceError(None, f"unknown bundled trace '{name}'",
                         fix=f"use one of {sorted(BUNDLED)}")
    return path


def resolve_trace_path(name_or_path: str | Path) -> Path:
    """An existing file path as given, else the bundled trace of that name."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    if isinstance(name_or_path, str) and name_or_path.strip().lower() in BUNDLED:
        return bundled(name_or_path)
    problem = "is a directory, not a file" if path.is_dir() else "file not found"
    raise TraceError(path, problem,
                     fix=f"give a trace file path or a bundled name ({', '.join(sorted(BUNDLED))})")
