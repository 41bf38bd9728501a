import sys

from ceiling.cli import main

sys.exit(main())
