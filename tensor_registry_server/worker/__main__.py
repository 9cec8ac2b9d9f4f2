"""``python -m tensor_registry_server.worker``: one worker process (see
tensor_registry_server.worker.main)."""

import sys

from tensor_registry_server.worker.main import main

sys.exit(main())
