"""`python -m service.cli`: the `trident` command."""

import sys

from service.cli import main

sys.exit(main())
