"""Simulator glue for the discovery plugins: attach a plugin to every node of a ``Network``
and drive it in virtual time, through the very protocol code a live node runs."""
