import sys

from ulacache_cli.main import main

sys.exit(main())
