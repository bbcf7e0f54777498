"""Glue for frameworks that need more than ``isinstance(loader, DataLoader)``."""
