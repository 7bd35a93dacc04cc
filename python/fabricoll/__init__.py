"""fabricoll: collectives over libfabric, from Python.

- :mod:`fabricoll.torch`: the torch.distributed backend ``"fabricoll"`` (``import
  fabricoll.torch`` registers it);
- :mod:`fabricoll._capi`: ctypes declarations of the C API (``include/fabricoll.h``).

The shared library is found at ``FABRICOLL_LIB``, else in this package (``fabricoll/lib``,
as a wheel carries it), else in the repository's ``target/release``.
"""

from ._capi import FabricollError, lib, version

__all__ = ["FabricollError", "lib", "version"]
