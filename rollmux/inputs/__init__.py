"""The edges: user files (traces, profiles, job specs) parsed and validated into core objects."""
