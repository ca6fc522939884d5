"""A bandwidth-limited link on one host: two network namespaces joined by a shaped veth pair.

Loopback is so fast that compression only costs time; these helpers put rank 0 and rank 1 on
either end of a link shaped with tc so that the wall-clock effect of compression can be
measured with real processes and real sockets, and held against the cost model.
"""
