import sys

from ledgerdash.sandbox.server import main

sys.exit(main())
