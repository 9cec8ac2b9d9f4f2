"""tensor-registry's server: the API, its domains, storage and the standard doors.

The release number is the library's (tensor_registry.version): one repository, one number.
"""

from tensor_registry.version import __version__

__all__ = ["__version__"]
