"""Namespaces and the right to make them: network namespaces entered without forking (netns),
user namespaces for rootless runs (userns, privilege), and the PID namespace whose init ends a
run's processes with it (lifetime)."""
