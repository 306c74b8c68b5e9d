import sys

from headscope.reports.cli.app import main

sys.exit(main())
