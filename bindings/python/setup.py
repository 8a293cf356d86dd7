"""Ships the checkout's libforge.so inside the package when it is there; pyproject.toml holds
everything else. At build time (pip install ./bindings/python) the library is taken from
$FORGE_LIBRARY if set, else from ../../build/libforge.so (what `make` builds): the installed
package then finds its own copy with no environment variable. Without either, the package
installs without a library and looks for the system's libforge.so.0 (make install)."""
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        here = os.path.dirname(os.path.abspath(__file__))
        candidates = [os.environ.get("FORGE_LIBRARY", ""), os.path.join(here, "..", "..", "build", "libforge.so")]
        for lib in candidates:
            if lib and os.path.isfile(lib):
                # copyfile follows links: the package gets the library itself, not a dangling link
                shutil.copyfile(lib, os.path.join(self.build_lib, "forge", "libforge.so"))
                break


setup(cmdclass={"build_py": BuildPyWithLibrary})
