"""How a process worker's batch reaches the main process: shared-memory slots and a codec.

``arena`` (memfd slots, their ``budget`` and ``lease``: the process pool's own),
``codec`` and ``pickler`` (pickle 5 with out-of-band buffers), ``object_store`` (Ray
workers' batches). Only small metadata crosses a pipe; arrays arrive as views.
"""
