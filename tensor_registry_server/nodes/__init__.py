"""What runs where: node check-ins (agents), the fleet list and the rollout view of an alias."""
