"""Runtime: real execution of lightrail schedules on torch.distributed (and, later, the controller)."""
