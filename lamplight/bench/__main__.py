import sys

from lamplight.bench.cli import main

sys.exit(main())
