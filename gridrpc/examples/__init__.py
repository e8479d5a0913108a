"""Example services shipped with gridrpc."""
