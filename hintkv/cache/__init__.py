"""hintkv.cache"""
