"""One mirrored table: MemSlice, apply, disk files, persist, ReadState, schema state and evolution.

See docs/architecture.md#data-path. (A regular package, so that the import-linter contracts and mypy
see it as one.)
"""
