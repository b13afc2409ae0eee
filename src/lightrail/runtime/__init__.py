"""Runtime: the OCS controller service and its drivers, the torch.distributed backend that executes the
Plan for real, and real execution of lightrail schedules on torch.distributed."""
