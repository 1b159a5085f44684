"""hintkv.server"""
