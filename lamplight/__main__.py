"""`python -m lamplight ...`: the same command line as `lamplight ...`."""

import sys

from lamplight.cli import main

sys.exit(main())
