"""The release of the library and of the server built from this repository (one number)."""

__version__ = "0.1.0"
