"""Deployment: start a whole gridrpc tree locally, over SSH or inside Slurm.

The launchers (one host each) live in :mod:`gridrpc.deploy.launchers`.
"""
