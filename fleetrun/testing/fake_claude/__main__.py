"""The fake's entry point: ``python <this folder>`` (by path, fleetrun not needed) or
``python -m fleetrun.testing.fake_claude``; the package's docstring says how the two
find the other modules."""

import os
import sys

#: The name this folder is loaded under when it is run by path.
PACKAGE = "_fleetrun_fake_claude"

if __package__:  # python -m fleetrun.testing.fake_claude: a part of its package already
    from .cli import main
else:  # by path: no package, so load this folder as one (never through sys.path)
    import importlib.util

    _here = os.path.dirname(os.path.abspath(__file__))
    _spec = importlib.util.spec_from_file_location(PACKAGE, os.path.join(_here, "__init__.py"),
                                                   submodule_search_locations=[_here])
    _package = importlib.util.module_from_spec(_spec)
    sys.modules[PACKAGE] = _package
    _spec.loader.exec_module(_package)
    main = _package.main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
