"""Reports for people: plots and files, written atomically (nothing half-written on failure)."""
