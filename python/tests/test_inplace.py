"""The backend asks its communicators not to restore a failed in-place call's tensor
(``fabricoll_config.inplace``): torch's all_reduce is in place and gloo does not restore either,
and restoring costs a copy of the tensor per call. Checked without ranks: the option's mapping,
the environment's precedence, and that the ctypes struct is the library's size (every field)."""
import ctypes
import os
import unittest
from unittest import mock

from fabricoll import _bootstrap, _capi as c


class InPlaceOption(unittest.TestCase):
    def test_default_is_undefined_unless_the_environment_chooses(self):
        with mock.patch.dict(os.environ, {}, clear=False):
            os.environ.pop("FABRICOLL_INPLACE_RESTORE", None)
            self.assertEqual(_bootstrap._inplace_value(None), c.INPLACE_UNDEFINED)
            os.environ["FABRICOLL_INPLACE_RESTORE"] = "1"
            self.assertEqual(_bootstrap._inplace_value(None), c.INPLACE_DEFAULT)
            self.assertEqual(_bootstrap._inplace_value(False), c.INPLACE_UNDEFINED)
        self.assertEqual(_bootstrap._inplace_value(True), c.INPLACE_RESTORE)
        self.assertIn("inplace_restore=True", repr(_bootstrap.Options(inplace_restore=True)))

    def test_the_struct_matches_the_library(self):
        cfg = c.Config()
        # The library refuses a size larger than its own struct, so success proves Python's
        # declaration is no larger than the library's; the size it sets back proves equal.
        c.call("config_init_size", ctypes.byref(cfg), ctypes.sizeof(cfg))
        self.assertEqual(cfg.size, ctypes.sizeof(c.Config))
        self.assertEqual(cfg.inplace, c.INPLACE_DEFAULT)
        self.assertEqual((cfg.compress, cfg.compress_block), (c.COMPRESS_DEFAULT, 0))
        # ... and a larger size is refused, so Python declares every field the library has.
        larger = (ctypes.c_char * (ctypes.sizeof(cfg) + 8))()
        with self.assertRaises(c.FabricollError) as e:
            c.call("config_init_size", ctypes.cast(larger, ctypes.POINTER(c.Config)),
                   ctypes.sizeof(larger))
        self.assertIn("size", str(e.exception))
        with mock.patch.dict(os.environ, {}, clear=False):
            os.environ.pop("FABRICOLL_INPLACE_RESTORE", None)
            made, _keep = _bootstrap._config(_bootstrap.Options(), None, None)
        self.assertEqual(made.inplace, c.INPLACE_UNDEFINED)


if __name__ == "__main__":
    unittest.main()
