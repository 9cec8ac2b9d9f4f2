"""`python -m tensor_registry.cli`: the `tensor-registry` command."""

import sys

from tensor_registry.cli.main import main

sys.exit(main())
