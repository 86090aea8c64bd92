"""The library's error types. Every rejection of user input raises one of these."""

from __future__ import annotations


class LLMCommError(Exception):
    """Base class of every error llmcomm raises on purpose."""


class ConfigError(LLMCommError, ValueError):
    """A model / parallel / cluster combination breaks a rule; the message names the rule."""


class TraceFormatError(LLMCommError, ValueError):
    """A trace or measurement file is malformed; the message names the file, the field and the rule."""


class AnalysisError(LLMCommError, ValueError):
    """An analysis was asked of a trace that cannot answer it (timings of an untimed trace, a layout that the
    trace's metadata does not give) or with an argument outside its domain; the message says which."""


class DataError(LLMCommError, RuntimeError):
    """External data is missing or fails its checksum."""


class UsageError(LLMCommError, ValueError):
    """A command was called in a way it cannot honour (an output path that cannot be written, a name that
    matches nothing); the ``llmcomm`` command exits with status 2 for it, as for a malformed option."""
