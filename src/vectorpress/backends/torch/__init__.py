"""The native torch backend: packed sequences, one model file per architecture."""
