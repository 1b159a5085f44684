"""hintkv.cache.policies"""
