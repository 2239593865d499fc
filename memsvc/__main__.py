"""``python -m memsvc``: the ``memsvc`` command (``memsvc.cli``)."""

import sys

from memsvc.cli import main

sys.exit(main())
