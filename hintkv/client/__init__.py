"""hintkv.client"""
