"""hintkv.tiers"""
