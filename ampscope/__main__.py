import sys

from ampscope.cli.main import main

sys.exit(main())
