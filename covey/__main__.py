import sys

from covey.cli import main

sys.exit(main())
