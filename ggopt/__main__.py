"""``python -m ggopt``: the ``ggopt`` command (:mod:`ggopt.cli.main`)."""

import sys

from .cli.main import main

sys.exit(main())
