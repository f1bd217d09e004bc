"""Offerings: the admin's configured ones, the ones discovered from node labels, overrides, and the user's choice among them. Pure."""
