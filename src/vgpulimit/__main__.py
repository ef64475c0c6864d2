"""``python -m vgpulimit``: the same as the ``vgpulimit`` command."""

import sys

from vgpulimit.cli import main

sys.exit(main())
