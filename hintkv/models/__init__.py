"""hintkv.models"""
