"""`python -m temper` is the `temper` command."""

import sys

from temper.cli.main import main

sys.exit(main())
