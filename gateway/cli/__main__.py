"""`python -m gateway.cli`: the `zeps` command, for processes started with the interpreter at hand."""

import sys

from gateway.cli.main import main

sys.exit(main())
