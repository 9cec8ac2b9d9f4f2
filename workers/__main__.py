"""``python -m workers``: one worker process (see workers.main)."""

import sys

from workers.main import main

sys.exit(main())
