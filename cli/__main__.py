import sys

from spreeze.cli.main import main

sys.exit(main())
