"""memplan.pool.allocators: every pool allocator, one registry (base.py).

Offline allocators (SmartPool, smartpool.py) return offsets; online allocator simulators
(online.py) return the peak memory they reserve and, where they place buffers in address
space, offsets too (their regions laid end to end). A new allocator is one module here.
"""
