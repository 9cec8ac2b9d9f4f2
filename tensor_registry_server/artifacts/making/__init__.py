"""Making an artifact: what a worker runs for a tensorize, verify or register job (the
request side is the rest of this domain). Torch, transformers and tensorizer load here, only
in the worker's job process."""
