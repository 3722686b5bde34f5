"""An install without extras, made on the fly: with this directory on PYTHONPATH, every module named in
ZEPS_TEST_HIDE (comma-separated top-level names) fails to import as an uninstalled one does, find_spec included."""

import os
import sys
from importlib.abc import MetaPathFinder

HIDDEN = {name for name in os.environ.get("ZEPS_TEST_HIDE", "").split(",") if name}


class Hide(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Hide())
