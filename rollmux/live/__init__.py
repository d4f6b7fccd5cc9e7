"""Plans and traces on the live system, as clients of the control plane: ``run_plan``
(``rollmux run``) and the live trace replay (``rollmux replay``), embedding a control plane
where the Ray cluster has none. The wall-clock counterpart of :mod:`rollmux.sim`.
"""
