"""The job side: what job code and job drivers import (``rollmux.phase`` and the session,
role adapters, role state, packed weights, job programs, the driver loop), code that runs
inside a user's job.

It speaks to the control plane over the wire (:mod:`rollmux.wire`) and to its nodes'
workers through Ray. The control plane imports none of it: the entry points hand it what
it runs of the job side (:mod:`rollmux.sdk.jobcode`).
"""
