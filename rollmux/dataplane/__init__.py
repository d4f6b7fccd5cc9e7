"""The Ray data plane that the control plane drives: logical nodes (placement groups with a
pool worker each), warm driver processes, wide roles' process groups, joining the cluster.

Its processes host the job side's code but import none of it (roles are duck-typed, and
what drivers and warm-ups run is handed in), so the control plane loads no job library.
"""
