"""The kernel's counters read while the ranks train: a sampling thread (sampling_thread), the
racks' uplinks and the nodes' TCP connections sampled on it, the TCP and qdisc counters they
read, and a node's own link read from inside it (own_link)."""
