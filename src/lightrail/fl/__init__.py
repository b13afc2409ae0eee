"""Propius: a multi-tenant resource manager for collaborative (federated) ML (jobs, clients, scheduler, parameter
servers)."""
