"""hintkv.protocol"""
