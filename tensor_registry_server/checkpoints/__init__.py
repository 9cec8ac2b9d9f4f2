"""Checkpoint validation without torch, shared by finalize and the workers."""
