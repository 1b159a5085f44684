"""hintkv.bench"""
