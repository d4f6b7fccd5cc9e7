"""What both sides of the wire use: the control plane's HTTP client and the turn-taking
protocol jobs speak (with the bearer token's file), and the process helpers that the
control plane, the data plane and job processes share (failpoints, observed background
tasks). It imports nothing of either side.
"""
