import sys

from trimaran.cli import main

sys.exit(main())
