"""``python -m tensor_registry_server.jobs.worker``: one worker process (see
tensor_registry_server.jobs.worker.main)."""

import sys

from tensor_registry_server.jobs.worker.main import main

sys.exit(main())
